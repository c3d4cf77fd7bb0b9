#include "threads/shard_channels.hpp"

#include <algorithm>

namespace evb {

PipelineChannels::PipelineChannels(std::uint32_t shards, std::size_t slots, std::size_t events) {
    // Every batch holds one receive slot at least, and events are spread over the
    // shards by id: twice a shard's share of the slots (at most 64 k messages) is
    // room enough; a full inbox makes its putter wait for the driver.
    const std::size_t inbox_capacity = std::min<std::size_t>(2 * slots / std::max<std::uint32_t>(shards, 1) + 1024, 65536);
    for (std::uint32_t k = 0; k < shards; ++k) shards_.push_back(std::make_unique<ShardChannels>(inbox_capacity, events));
}

std::vector<SpscRing<WriterItem>*> PipelineChannels::writer_rings() {
    std::vector<SpscRing<WriterItem>*> v;
    for (auto& s : shards_) v.push_back(&s->to_writer);
    return v;
}

std::vector<SpscRing<Event*>*> PipelineChannels::done_rings() {
    std::vector<SpscRing<Event*>*> v;
    for (auto& s : shards_) v.push_back(&s->done);
    return v;
}

}  // namespace evb
