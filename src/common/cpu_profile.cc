#include "common/cpu_profile.h"

#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace refit {
namespace {

constexpr int kFrames = 48;
constexpr uint64_t kCpuSamples = uint64_t{1} << 16;   // 65 s of CPU time at 1 kHz; 27 MB
constexpr uint64_t kWallSamples = uint64_t{1} << 18;  // e.g. 20 threads for 65 s at 200 Hz; 107 MB

struct Sample {
  uint32_t tid;
  uint32_t depth;
  char thread[16];  // the thread's name when sampled (threads may end before the profile is written)
  void* pc[kFrames];
};

// The profile in progress (null when none). The samples are allocated before the timer starts
// and freed only after it stopped and the handler was reset, so the handler never sees them go.
Sample* samples = nullptr;
uint64_t max_samples = 0;
std::atomic<uint64_t> next_sample{0};
std::atomic<bool> running{false};
std::string* path = nullptr;
// REFIT_CPU_PROFILE_CLOCK=wall: a thread of its own signals every other thread at each tick, so
// that blocked threads are sampled too (where they wait).
std::thread* ticker = nullptr;
const char* clock_name = "cpu";
std::atomic<bool> ticking{false};
std::atomic<bool> written{false};

void OnProf(int, siginfo_t*, void* context) {
  if (!running.load(std::memory_order_relaxed)) return;
  const uint64_t i = next_sample.fetch_add(1, std::memory_order_relaxed);
  if (i >= max_samples) return;
  Sample& s = samples[i];
  s.tid = static_cast<uint32_t>(syscall(SYS_gettid));
  std::memset(s.thread, 0, sizeof(s.thread));
  prctl(PR_GET_NAME, s.thread);
  void* frames[kFrames];
  const int n = backtrace(frames, kFrames);
  // The handler's own frames and the signal trampoline come first: the sample starts at the
  // interrupted instruction (the context's pc), which the unwinder reports after them.
  const auto* uc = static_cast<const ucontext_t*>(context);
  void* pc = reinterpret_cast<void*>(uc->uc_mcontext.gregs[REG_RIP]);
  int first = 0;
  while (first < n && frames[first] != pc) ++first;
  if (first == n) {  // not found (an unwinder that skips it): keep the pc and the whole stack
    s.pc[0] = pc;
    const int rest = n < kFrames - 1 ? n : kFrames - 1;
    std::memcpy(&s.pc[1], frames, sizeof(void*) * static_cast<size_t>(rest));
    s.depth = static_cast<uint32_t>(rest + 1);
    return;
  }
  std::memcpy(s.pc, frames + first, sizeof(void*) * static_cast<size_t>(n - first));
  s.depth = static_cast<uint32_t>(n - first);
}

std::string ReadFile(const std::string& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteProfile();

// Each tick, SIGPROF to every thread of the process but this one and the CUDA driver's own
// ("cuda*": the driver's threads are left uninterrupted); the list is read again each tick
// (threads come and go). With a duration (REFIT_CPU_PROFILE_SECONDS), the profile is written here
// once it has passed, so that it exists even if the process never exits cleanly.
void Tick(long hz, double seconds) {
  const pid_t pid = getpid();
  const auto self = static_cast<pid_t>(syscall(SYS_gettid));
  const auto period = std::chrono::nanoseconds(1000000000 / hz);
  pthread_setname_np(pthread_self(), "refit-profiler");
  std::vector<pid_t> tids;
  std::unordered_map<pid_t, bool> skip;  // by thread: the CUDA driver's
  const auto start = std::chrono::steady_clock::now();
  auto next = start;
  while (ticking.load(std::memory_order_relaxed)) {
    if (seconds > 0 && std::chrono::steady_clock::now() - start >= std::chrono::duration<double>(seconds)) {
      running.store(false);                                        // handlers that start now return at once
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // those running finish
      WriteProfile();
      return;
    }
    tids.clear();
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
      const auto tid = static_cast<pid_t>(std::atol(task.path().filename().c_str()));
      if (tid <= 0 || tid == self) continue;
      auto [it, fresh] = skip.try_emplace(tid, false);
      if (fresh) it->second = ReadFile(task.path().string() + "/comm").rfind("cuda", 0) == 0;
      if (!it->second) tids.push_back(tid);
    }
    for (pid_t tid : tids) syscall(SYS_tgkill, pid, tid, SIGPROF);
    next += period;
    std::this_thread::sleep_until(next);
  }
}

}  // namespace

bool StartCpuProfileFromEnv() {
  const char* file = std::getenv("REFIT_CPU_PROFILE");
  if (file == nullptr || *file == '\0' || samples != nullptr) return false;
  const char* clock = std::getenv("REFIT_CPU_PROFILE_CLOCK");
  const bool wall = clock != nullptr && std::strcmp(clock, "wall") == 0;
  long hz = wall ? 200 : 1000;
  if (const char* h = std::getenv("REFIT_CPU_PROFILE_HZ"); h != nullptr && std::atol(h) > 0) hz = std::atol(h);
  if (wall && hz > 10000) hz = 10000;
  max_samples = wall ? kWallSamples : kCpuSamples;
  samples = new Sample[max_samples];
  // "%p" in the name becomes the process id: the refitd processes of one benchmark run each write
  // their own profile.
  std::string name(file);
  if (size_t at = name.find("%p"); at != std::string::npos) name.replace(at, 2, std::to_string(getpid()));
  path = new std::string(std::move(name));
  void* warm[4];
  (void)backtrace(warm, 4);  // loads the unwinder now, not inside the first signal
  struct sigaction sa {};
  sa.sa_sigaction = OnProf;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGPROF, &sa, nullptr);
  running.store(true);
  if (wall) {
    clock_name = "wall";
    ticking.store(true);
    double seconds = 0;
    if (const char* d = std::getenv("REFIT_CPU_PROFILE_SECONDS"); d != nullptr) seconds = std::atof(d);
    ticker = new std::thread(Tick, hz, seconds);
  } else {
    itimerval t{};
    t.it_interval.tv_sec = 0;
    t.it_interval.tv_usec = static_cast<suseconds_t>(hz >= 1000000 ? 1 : 1000000 / hz);
    t.it_value = t.it_interval;
    setitimer(ITIMER_PROF, &t, nullptr);
  }
  std::atexit(StopCpuProfile);
  return true;
}

void StopCpuProfile() {
  if (samples == nullptr) return;
  if (ticker != nullptr) {
    ticking.store(false);
    ticker->join();  // it may have written the profile already (REFIT_CPU_PROFILE_SECONDS)
    delete ticker;
    ticker = nullptr;
  }
  running.store(false);
  itimerval off{};
  setitimer(ITIMER_PROF, &off, nullptr);
  signal(SIGPROF, SIG_IGN);
  WriteProfile();
}

namespace {

void WriteProfile() {
  if (written.exchange(true)) return;
  const uint64_t n = next_sample.load() < max_samples ? next_sample.load() : max_samples;
  std::FILE* f = std::fopen(path->c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "REFIT_CPU_PROFILE: cannot write %s\n", path->c_str());
    return;
  }
  // Text: the samples ("s <tid> <thread name> <pc> ..."), then the threads' names and the mappings.
  std::fprintf(f, "refit-cpu-profile 1\nclock %s\nsamples %llu dropped %llu\n", clock_name,
               static_cast<unsigned long long>(n), static_cast<unsigned long long>(next_sample.load() - n));
  for (uint64_t i = 0; i < n; ++i) {
    const Sample& s = samples[i];
    char name[sizeof(s.thread) + 1] = {};
    std::memcpy(name, s.thread, sizeof(s.thread));
    for (char* c = name; *c != '\0'; ++c) {
      if (*c == ' ') *c = '_';
    }
    std::fprintf(f, "s %u %s", s.tid, name[0] != '\0' ? name : "-");
    for (uint32_t d = 0; d < s.depth; ++d)
      std::fprintf(f, " %llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(s.pc[d])));
    std::fputc('\n', f);
  }
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::string comm = ReadFile(task.path().string() + "/comm");
    if (!comm.empty() && comm.back() == '\n') comm.pop_back();
    std::fprintf(f, "t %s %s\n", task.path().filename().c_str(), comm.c_str());
  }
  std::fputs("maps\n", f);
  std::fputs(ReadFile("/proc/self/maps").c_str(), f);
  std::fclose(f);
}

}  // namespace

}  // namespace refit
