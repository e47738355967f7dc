// A sampling profile of a process's CPU time, for host-side latency work on machines without a
// profiler (perf, gdb). With REFIT_CPU_PROFILE=<file> in refitd's environment, every thread's
// stack is sampled each REFIT_CPU_PROFILE_HZ (default 1000) per second of the process's CPU time
// (ITIMER_PROF, so an idle thread costs nothing and is never sampled); the samples, the threads'
// names and the process's memory mappings are written to the file when refitd exits ("%p" in the
// name is replaced by the process id).
// REFIT_CPU_PROFILE_CLOCK=wall samples wall-clock time instead: a thread of its own sends SIGPROF to
// every other thread REFIT_CPU_PROFILE_HZ (default 200) times a second, so a thread blocked in a
// wait (a lock, a CUDA synchronization, a syscall) is sampled where it waits. The signals
// interrupt blocking syscalls (SA_RESTART restarts most of them); the CUDA driver's own threads
// ("cuda*") are not signalled. REFIT_CPU_PROFILE_SECONDS=S (wall clock) writes the profile S seconds
// after the start instead of at exit, so that a process that never exits cleanly still leaves it.
// tools/cpu_profile.py symbolizes them against the build and prints where the CPU time went,
// per thread and per function (self and inclusive). docs/operations.md "Profiling the host".
//
// Off by default. The signal handler unwinds with glibc's backtrace(), which is not strictly
// async-signal-safe (a sample that lands inside the dynamic loader could deadlock): a diagnostic
// for benchmark runs, not for production.
//
// Threading: Start and Stop from the main thread; samples land on any thread.
#ifndef REFIT_COMMON_CPU_PROFILE_H_
#define REFIT_COMMON_CPU_PROFILE_H_

namespace refit {

// Starts sampling when REFIT_CPU_PROFILE names a file (and registers StopCpuProfile at exit).
// Returns whether it started.
bool StartCpuProfileFromEnv();

// Stops sampling and writes the profile; a no-op when none runs or it was written already.
void StopCpuProfile();

}  // namespace refit

#endif  // REFIT_COMMON_CPU_PROFILE_H_
