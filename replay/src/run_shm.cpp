// RunShm: creates, attaches, checks and removes the five segments of one run; the candidate
// ledger, room and reap for supervision; salvage_or_count for a run whose launcher died.
#include "kf/replay/replay.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "queue.h"
#include "segment.h"
#include "shm_util.h"

namespace kf::replay {
using namespace detail;

namespace {
const char* const kParts[] = {"cand", "replay", "kdb", "snap", "ctl"};
// Parts of older builds (the result queue): removed with a run, never created.
const char* const kOldParts[] = {"res"};

std::string lock_path(const std::string& run) { return "/dev/shm/kf." + run + ".lock"; }

// Serialises creators of one run name; released on close (or when the process dies).
class CreateLock {
 public:
  explicit CreateLock(const std::string& run) {
    fd_ = ::open(lock_path(run).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0) throw Error("replay: run '" + run + "': cannot open " + lock_path(run) + ": " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd_);
      throw Error("replay: run '" + run + "': another launcher is creating this run right now");
    }
  }
  ~CreateLock() { ::close(fd_); }

 private:
  int fd_ = -1;
};

void check_incarnation(const std::string& run, const char* part, const ShmSegment& s, uint64_t inc) {
  if (s.incarnation() != inc)
    throw Error("replay: run '" + run + "': segment " + part +
                ": field incarnation differs from the control block (stale segment from another run)");
}
}  // namespace

struct RunShm::Parts {
  std::string run;
  bool creator = false;
  bool shut = false;
  std::unique_ptr<ControlBlock> control;
  std::unique_ptr<ReplayBuffer> replay;  // before candidates: the queue resolves in it
  std::unique_ptr<CandidateQueue> candidates;
  std::unique_ptr<KernelDb> kernels;
  std::unique_ptr<SnapshotStore> snapshots;
};

RunShm::RunShm() : p_(std::make_unique<Parts>()) {}
ControlBlock& RunShm::control() { return *p_->control; }
CandidateQueue& RunShm::candidates() { return *p_->candidates; }
ReplayBuffer& RunShm::replay() { return *p_->replay; }
KernelDb& RunShm::kernels() { return *p_->kernels; }
SnapshotStore& RunShm::snapshots() { return *p_->snapshots; }
const std::string& RunShm::run() const { return p_->run; }
bool RunShm::is_creator() const { return p_->creator; }

QueueLedger RunShm::candidate_ledger() const { return p_->candidates->raw().ledger(); }

CandidateRoom RunShm::candidate_room() const {
  ShmQueue& q = p_->candidates->raw();
  return {q.stats().free_slots, q.capacity()};
}

std::size_t RunShm::reap() { return p_->candidates->raw().reap() + p_->replay->reap(); }

std::string RunShm::segment_name(const std::string& run, const char* part) { return "kf." + run + "." + part; }

SegmentState RunShm::probe(const std::string& run, std::chrono::milliseconds stale_after) {
  check_name(run, "run name");
  const std::string ctl = segment_name(run, "ctl");
  SegmentState st = ShmSegment::probe(ctl);  // creator identity only
  if (st == SegmentState::Live && stale_after.count() > 0) {
    // A live creator is hung only if neither it nor any registered process of the run
    // has beaten within stale_after ("no live heartbeat").
    try {
      ControlBlock c = ControlBlock::attach(ctl, std::chrono::milliseconds(200));
      int64_t newest =
          std::max<int64_t>(static_cast<int64_t>(segment_header(c.segment())->heartbeat_ns), c.newest_heartbeat_ns());
      if (now_ns() - newest > std::chrono::duration_cast<std::chrono::nanoseconds>(stale_after).count())
        return SegmentState::Stale;
    } catch (const Error&) {
      return SegmentState::Stale;  // live creator, but its control block never became ready
    }
    return SegmentState::Live;
  }
  if (st != SegmentState::Absent) return st;
  for (const char* p : kParts)
    if (ShmSegment::probe(segment_name(run, p)) != SegmentState::Absent) return SegmentState::Stale;  // half-made run
  return SegmentState::Absent;
}

void RunShm::remove(const std::string& run) {
  check_name(run, "run name");
  for (const char* p : kParts) ShmSegment::remove(segment_name(run, p));
  for (const char* p : kOldParts) ShmSegment::remove(segment_name(run, p));
}

std::unique_ptr<RunShm> RunShm::create(const std::string& run, const RunShmConfig& cfg) {
  check_name(run, "run name");
  CreateLock lock(run);
  SegmentState st = probe(run, cfg.stale_after);
  if (st == SegmentState::Live)
    throw Error("replay: run '" + run + "' is live (its launcher is running); stop it or pick another run name");
  if (st == SegmentState::Stale) {
    log_warn("replay: run '", run, "': replacing stale shared-memory segments");
    remove(run);
  }
  std::unique_ptr<RunShm> r(new RunShm());
  r->p_->run = run;
  r->p_->creator = true;
  SegmentOptions opt;
  opt.stale_after = cfg.stale_after;
  opt.incarnation = 0;
  try {
    // The control block goes last: its ready flag is what attachers wait for.
    QueueConfig qc = cfg.candidates;
    qc.slot_bytes = static_cast<uint32_t>(kCandidateRefBytes);  // a slot holds one handle
    ShmQueue probe_inc = ShmQueue::create(segment_name(run, "cand"), qc, opt);
    opt.incarnation = probe_inc.segment().incarnation();
    r->p_->replay = std::make_unique<ReplayBuffer>(ReplayBuffer::create(segment_name(run, "replay"), cfg.replay, &opt));
    r->p_->candidates = std::make_unique<CandidateQueue>(std::move(probe_inc), r->p_->replay.get());
    r->p_->kernels = std::make_unique<KernelDb>(KernelDb::create(segment_name(run, "kdb"), cfg.kernels, &opt));
    r->p_->snapshots =
        std::make_unique<SnapshotStore>(SnapshotStore::create(segment_name(run, "snap"), cfg.snapshot, &opt));
    r->p_->control = std::make_unique<ControlBlock>(ControlBlock::create(segment_name(run, "ctl"), &opt));
  } catch (...) {
    remove(run);
    throw;
  }
  beat_segment(r->p_->control->segment());
  return r;
}

std::unique_ptr<RunShm> RunShm::attach(const std::string& run, Timeout wait_ready) {
  check_name(run, "run name");
  std::unique_ptr<RunShm> r(new RunShm());
  r->p_->run = run;
  r->p_->control = std::make_unique<ControlBlock>(ControlBlock::attach(segment_name(run, "ctl"), wait_ready));
  const uint64_t inc = r->p_->control->segment().incarnation();
  r->p_->replay = std::make_unique<ReplayBuffer>(ReplayBuffer::attach(segment_name(run, "replay"), wait_ready));
  check_incarnation(run, "replay", r->p_->replay->segment(), inc);
  r->p_->candidates =
      std::make_unique<CandidateQueue>(ShmQueue::attach(segment_name(run, "cand"), wait_ready), r->p_->replay.get());
  check_incarnation(run, "cand", r->p_->candidates->raw().segment(), inc);
  if (r->p_->candidates->raw().slot_bytes() != kCandidateRefBytes)
    throw Error("replay: run '" + run + "': segment cand: field slot_bytes is " +
                std::to_string(r->p_->candidates->raw().slot_bytes()) + ", this build's candidate handle takes " +
                std::to_string(kCandidateRefBytes) + " (a queue made by another build)");
  r->p_->kernels = std::make_unique<KernelDb>(KernelDb::attach(segment_name(run, "kdb"), wait_ready));
  check_incarnation(run, "kdb", r->p_->kernels->segment(), inc);
  r->p_->snapshots = std::make_unique<SnapshotStore>(SnapshotStore::attach(segment_name(run, "snap"), wait_ready));
  check_incarnation(run, "snap", r->p_->snapshots->segment(), inc);
  return r;
}

RunShm::~RunShm() {
  if (p_->creator) {
    try {
      shutdown();
    } catch (...) {
    }
  }
}

void RunShm::heartbeat() { beat_segment(p_->control->segment()); }

void RunShm::shutdown() {
  if (!p_->creator || p_->shut) return;
  p_->shut = true;
  p_->control->set_state(RunState::stopped);
  remove(p_->run);
  ::unlink(lock_path(p_->run).c_str());
}

void RunShm::save(const std::string& run_dir) const {
  std::filesystem::create_directories(run_dir + "/checkpoints");
  std::filesystem::create_directories(run_dir + "/kernels");
  p_->replay->save(run_dir + "/checkpoints/replay.bin");
  p_->kernels->save(run_dir + "/kernels/kernel_db.json");
}

int RunShm::load(const std::string& run_dir) {
  int n = 0;
  if (std::filesystem::exists(run_dir + "/checkpoints/replay.bin")) {
    p_->replay->load(run_dir + "/checkpoints/replay.bin");
    ++n;
  }
  if (std::filesystem::exists(run_dir + "/kernels/kernel_db.json")) {
    p_->kernels->load(run_dir + "/kernels/kernel_db.json");
    ++n;
  }
  return n;
}

Salvage salvage_or_count(const std::string& run, const std::string& run_dir) {
  check_name(run, "run name");
  Salvage out;
  const std::string name = RunShm::segment_name(run, "cand");
  const SegmentState st = ShmSegment::probe(name);
  if (st == SegmentState::Absent) return out;
  if (st == SegmentState::Live)
    throw Error("replay: run '" + run + "': its shared memory belongs to a live launcher (segment " + name +
                "); not salvaging");
  ShmQueue q = ShmQueue::attach(name, std::chrono::milliseconds(200));
  q.reap();  // claims of evaluators that died with the launcher: back to the queue or counted
  out.found = true;
  out.ledger = q.ledger();
  const auto pending = q.pending_tags();
  std::ofstream f;
  if (!pending.empty() && !run_dir.empty()) {
    std::filesystem::create_directories(run_dir + "/metrics");
    f.open(run_dir + "/metrics/lost_candidates.jsonl", std::ios::app);
    if (!f)
      log_error("replay: cannot append to ", run_dir,
                "/metrics/lost_candidates.jsonl; the losses are logged here only");
  }
  for (const auto& [id, claimed] : pending) {
    out.lost_ids.push_back(id);
    log_error("replay: run ", run, ": candidate ", id, claimed ? " was claimed by an evaluator" : " was queued",
              " when the launcher died; its group died with the old replay, so it is counted lost (launcher_died)");
    if (f)
      f << "{\"candidate\": " << id << ", \"reason\": \"launcher_died\", \"state\": \""
        << (claimed ? "claimed" : "queued") << "\"}\n";
  }
  out.ledger.lost_run_died = out.ledger.queued + out.ledger.in_flight;
  out.ledger.queued = out.ledger.in_flight = 0;
  if (!pending.empty())
    log_warn("replay: run ", run, ": ", pending.size(), " candidate(s) of the old shared memory counted lost; ",
             "old ledger: created ", out.ledger.created, ", scored ", out.ledger.scored, ", lost ", out.ledger.lost());
  return out;
}

}  // namespace kf::replay
