// The version every program prints for --version: the project's (project(VERSION)
// in CMakeLists.txt), passed as EVB_VERSION to each program's target.
#pragma once

#ifndef EVB_VERSION
#define EVB_VERSION "unknown"
#endif
