// torch's OpenMP threads and the other ranks that share the node's cores.
//
// torch's intra-op threads are an OpenMP team (libgomp in the PyPI and
// conda-forge builds). Between parallel regions libgomp lets them spin
// 300,000 rounds before they sleep, only 100 once it counts more OpenMP
// threads than CPUs. It counts its own process's threads alone: ranks
// that share a node's cores each take the cores for their own, and their
// spinning threads hold the cores the other ranks compute on (2 ranks x 2
// threads on 2 cores: examples/train_fsdp2.py 2.4x slower). libgomp reads
// its settings once, when it loads, and has no call to change them; what
// it does look at, at every wait, is how many threads it runs. So where
// the ranks whose CPUs overlap (libmojoccl's mojocclCommCoreSharing) times
// torch's threads outnumber those CPUs, a thread of its own holds a
// team of idle threads big enough to carry libgomp's count past its CPUs:
// the compute threads then spin briefly and sleep, as they would in one
// process that outnumbered its cores. Ranks bound to cores of their own
// are left as they are.
//
// No torch headers here.
#pragma once

#include <string>

namespace torch_mojo {

// Called as each group starts: the first that needs it starts the team,
// which lives as long as the process. One team per process, whatever the
// groups. Returns what was done, for the trace, or "" when nothing was
// needed or torch's threads are not libgomp's.
std::string yieldOpenMpToOtherRanks(int ranksSharingCores, int sharedCpus);

}  // namespace torch_mojo
