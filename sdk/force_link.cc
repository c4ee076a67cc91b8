// References one symbol of each object that the installed headers declare,
// so that the linker keeps those objects in libdownpour.so: Bazel links a
// shared library's dependencies on demand, and a library with no code of
// its own demands nothing. Whatever they need comes along with them.
#include "client/client.h"
#include "client/job_member.h"
#include "common/auth.h"

namespace downpour {
namespace sdk_internal {

extern void* const kKeepInLibrary[];
void* const kKeepInLibrary[] = {
    reinterpret_cast<void*>(&Client::Connect),           // client/client.cc
    reinterpret_cast<void*>(&ClusterAuth::FromFile),     // common/auth.cc
    reinterpret_cast<void*>(&JobMember::Join),           // client/job_member.cc
    reinterpret_cast<void*>(&ConsistencyPolicy::Parse),  // consistency/
};

}  // namespace sdk_internal
}  // namespace downpour
