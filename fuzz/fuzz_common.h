// fusekit fuzzing: what every libFuzzer target shares (see docs/fuzzing.md). The declarations;
// the code is fuzz_common.cc, compiled once into the static library fusekit_fuzz_common that
// every target links (fuzz/CMakeLists.txt).
//
// A fuzz input is read front to back as named fields (one to eight bytes each); bytes past the end
// read as 0. A field's small values decode to the nominal, valid choice and its high values to a
// deviation (a null tensor, a huge size, a negative stride, ...), so that random bytes mostly give
// calls that get deep into the library. The seed writer runs the same decoder in record mode: it
// names a few fields, every other field reads 0, and the bytes the decoder consumed are the seed.
//
// The invariants (a violation prints what and where, then __builtin_trap() so libFuzzer reports
// it):
//   - every status is one of 0, 161001, 161002, 361001, 561000, 561002, 561003, and every non-zero
//     status leaves a new non-empty aclGetRecentErrMsg();
//   - aclCreateTensor accepts no view that reaches outside the storage it was given;
//   - phase one writes no byte of any buffer; a failed phase one returns no executor;
//   - a failed phase two writes no byte of any buffer;
//   - a successful phase two writes only inside the documented region of each output, and never
//     outside any buffer (guard bytes around every buffer, the workspace included).
#ifndef FUSEKIT_FUZZ_FUZZ_COMMON_H_
#define FUSEKIT_FUZZ_FUZZ_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "acl/acl.h"
#include "fusekit/dtype.h"
#include "fusekit/kernel_choice.h"
#include "fusekit/status.h"
#include "fusekit/tensor.h"

namespace fz {

// ---------------------------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------------------------

// Prints "INVARIANT VIOLATED: <what>" and the library's last message, then __builtin_trap().
[[noreturn]] __attribute__((format(printf, 1, 2))) void violated(const char *fmt, ...);

#define FZ_CHECK(cond, ...)                   \
  do {                                        \
    if (!(cond)) ::fz::violated(__VA_ARGS__); \
  } while (0)

// Known findings that a campaign may step around until they are fixed: FUSEKIT_FUZZ_AVOID is a
// comma-separated list of names (docs/fuzzing.md lists them); each target then stops generating
// the inputs that reach that finding. Empty by default: every finding is reported.
bool avoid(const char *known);

// ---------------------------------------------------------------------------------------------
// The input: named fields, front to back
// ---------------------------------------------------------------------------------------------

using Values = std::map<std::string, uint64_t>;

class Input {
 public:
  // Decode mode.
  Input(const uint8_t *data, size_t size) : data_(data), size_(size) {}
  // Record mode: each field reads the value `values` gives for its key ("grad.dim[1]"), or 0, and
  // the bytes that decode to it are appended to *out.
  Input(const Values *values, std::vector<uint8_t> *out) : values_(values), out_(out) {}

  uint64_t read(const char *a, const char *b, int i, int bytes);
  uint8_t u8(const char *a, const char *b = nullptr, int i = -1) {
    return static_cast<uint8_t>(read(a, b, i, 1));
  }
  uint16_t u16(const char *a, const char *b = nullptr, int i = -1) {
    return static_cast<uint16_t>(read(a, b, i, 2));
  }
  uint32_t u32(const char *a, const char *b = nullptr, int i = -1) {
    return static_cast<uint32_t>(read(a, b, i, 4));
  }
  uint64_t u64(const char *a, const char *b = nullptr, int i = -1) { return read(a, b, i, 8); }

  // Record mode: the keys of `values` that no field read (a misspelt seed).
  std::vector<std::string> unused() const;

  static std::string key(const char *a, const char *b, int i);

 private:
  const uint8_t *data_ = nullptr;
  size_t size_ = 0, pos_ = 0;
  const Values *values_ = nullptr;
  std::vector<uint8_t> *out_ = nullptr;
  std::set<std::string> used_;
};

// ---------------------------------------------------------------------------------------------
// Special values and the codes that select them (the tables themselves: fuzz_common.cc)
// ---------------------------------------------------------------------------------------------

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kP31 = int64_t{1} << 31, kP32 = int64_t{1} << 32;
// Sentinels inside the tables (values no table holds otherwise).
constexpr int64_t kNomPlus1 = kI64Min + 1, kNomMinus1 = kI64Min + 2, kNomTimes2 = kI64Min + 3,
                  kRaw = kI64Min + 4;

// Sizes: codes below kDimSpecial keep the nominal size.
constexpr uint8_t kDimSpecial = 192;

// Offsets (elements): below 128: 0; 128..191: 0..63; above: this table.
inline constexpr int64_t kOffsets[] = {64,
                                       255,
                                       256,
                                       1000,
                                       65536,
                                       int64_t{1} << 20,
                                       kP31,
                                       kP32,
                                       int64_t{1} << 40,
                                       int64_t{1} << 60,
                                       int64_t{1} << 61,
                                       int64_t{1} << 62,
                                       kI64Max / 8,
                                       kI64Max / 8 + 1,
                                       kI64Max / 4,
                                       kI64Max / 4 + 1,
                                       kI64Max / 2,
                                       kI64Max / 2 + 1,
                                       kI64Max - 1,
                                       kI64Max,
                                       -1,
                                       -2,
                                       kI64Min,
                                       kRaw};
constexpr int kNumOffsets = sizeof(kOffsets) / sizeof(kOffsets[0]);

// Strides: the code's block of 16 picks the kind.
enum StrideCode : uint8_t {
  kStrideNull = 0,           // below 128: null (contiguous)
  kStrideExplicit = 128,     // the contiguous strides, passed explicitly
  kStridePadded = 144,       // rows padded by 1 + pad % 64 elements
  kStrideZero = 160,         // dimension sdim % rank gets stride 0 (a broadcast)
  kStrideNegative = 176,     // dimension sdim gets the negated stride
  kStrideOverlap = 192,      // dimension sdim gets its contiguous stride - 1 (overlapping rows)
  kStrideHuge = 208,         // dimension sdim gets kHugeStrides[huge]
  kStrideTransposed = 224,   // the last two dimensions column-major
  kStridePerDimension = 240  // each dimension's stride from kSmallStrides[sval[i]]
};
inline constexpr int64_t kHugeStrides[] = {
    kP31,        kP32,    int64_t{1} << 40, int64_t{1} << 61,   int64_t{1} << 62,
    kI64Max / 2, kI64Max, kI64Min,          -(int64_t{1} << 62)};

// Storage descriptions (codes below 192: one dimension, the whole buffer).
enum StorageCode : uint8_t {
  kStorageWhole = 0,
  kStorageTight = 192,     // exactly the elements the view reaches (when it fits the buffer)
  kStorageNone = 208,      // storageDims null (only when the view fits the buffer)
  kStorageTwoD = 224,      // [avail / 2, 2]
  kStorageZero = 240,      // [0]
  kStorageNegative = 248,  // [-1]
  kStorageNineDims = 252   // nine dimensions (more than 8)
};

// Tensor modes.
enum ModeCode : uint8_t { kModeNormal = 0, kModeNullTensor = 248, kModeNullData = 252 };

// dtypes (codes 224 and up) and formats (240 and up), from tables inside aclDataType's and
// aclFormat's range ([-32, 31]).
constexpr uint8_t kDtypeSpecial = 224;
constexpr uint8_t kFormatSpecial = 240;
constexpr uint8_t kRankSpecial = 240;  // rank (code - 240) % 10: 0 to 9

// Double and integer attributes: codes below kAttrSpecial keep the nominal value.
constexpr uint8_t kAttrSpecial = 192;

// The code that selects a value of a table (a value in no table aborts: a seed's mistake).
uint8_t dim_code(int64_t v);
uint8_t offset_code(int64_t v);
uint8_t int_code(int64_t v);
uint8_t double_code(double v);
uint8_t dtype_code(int32_t v);
uint8_t format_code(int32_t v);

// Wrapping arithmetic for the harness's own bookkeeping (no undefined behaviour on any input).
inline int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
inline int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

// a * b for a, b >= 0, saturated at 2^100 (far past any buffer; no 128-bit overflow).
inline __int128 sat_mul(__int128 a, int64_t b) {
  constexpr __int128 kSat = static_cast<__int128>(1) << 100;
  if (a == 0 || b == 0) return 0;
  if (a >= kSat || a > kSat / b) return kSat;
  return a * b;
}

// A table value t, with the sentinels resolved against `nominal` (kRaw reads 8 more bytes).
int64_t special(int64_t t, int64_t nominal, Input &in, const char *a, const char *b, int i);
int64_t decode_dim(Input &in, const char *t, int i, int64_t nominal);
double decode_double(Input &in, const char *name, double nominal);
int64_t decode_int(Input &in, const char *name, int64_t nominal);

// ---------------------------------------------------------------------------------------------
// Element types as the library sees them
// ---------------------------------------------------------------------------------------------

fusekit::DType lib_dtype(int32_t acl);
// The element size aclCreateTensor uses for offsets (1 for the types it does not know).
size_t lib_esize(int32_t acl);
// The true element size, for filling buffers.
size_t real_esize(int32_t acl);
// Reads element bytes as float (float32, float16, bfloat16); NaN for any other type.
float load_float(const uint8_t *p, int32_t acl);

// ---------------------------------------------------------------------------------------------
// Tensor descriptions
// ---------------------------------------------------------------------------------------------

constexpr int kMaxRank = 10;  // decoded ranks go to 9 (the library takes at most 8)

struct Nominal {
  int32_t dtype = ACL_FLOAT;
  int rank = 0;
  int64_t dims[8] = {};
};

struct TensorSpec {
  const char *name = "";
  bool present = true;     // false: a null aclTensor *
  bool null_data = false;  // tensorData = nullptr
  int32_t dtype = ACL_FLOAT;
  int32_t format = ACL_FORMAT_ND;
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  bool explicit_strides = false;
  int64_t strides[kMaxRank] = {};  // the strides the library uses (computed when not explicit)
  int64_t offset = 0;
  int misalign = 0;  // bytes added to the data pointer
  int alias = -1;    // the index of an earlier tensor whose buffer this one lies in
  uint8_t storage = 0, fill = 0, slack = 0;
};

// The library's contiguous strides (a 0 size counts as 1), with wrapping arithmetic.
void contiguous_strides(const int64_t *dims, int rank, int64_t *strides);

// Decodes one tensor argument; `index` is its position in the call (aliasing picks an earlier one).
TensorSpec decode_tensor(Input &in, const char *name, const Nominal &nom, int index);

// ---------------------------------------------------------------------------------------------
// Buffers with guard bytes, contents
// ---------------------------------------------------------------------------------------------

constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0xA5;
constexpr size_t kCap = size_t{1} << 20;  // the largest real buffer
constexpr size_t kSmall = 64;             // the buffer of a view that would need more than kCap

struct Buffer {
  explicit Buffer(size_t n);
  uint8_t *payload() { return mem.get() + kGuard; }
  size_t total() const { return size + 2 * kGuard; }
  bool guards_intact() const;
  size_t size;
  std::unique_ptr<uint8_t[]> mem;
};

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  }
};

// What a buffer holds, by the role of the tensor that owns it.
enum class Fill {
  kFloat,
  kIndex,
  kCodes,
  kQmapSigned,
  kQmapUnsigned,
  kStep,
  kLr,
  kAbsmax,
  kRandom
};

void store_float(uint8_t *p, int32_t acl, float f);
// Little-endian truncation: an int64 value stored into int32 keeps its low 32 bits.
void store_int(uint8_t *p, int32_t acl, int64_t v);
// `bytes` of random bytes, then the contents of `kind` in fill mode `mode`; `bound` is the index
// bound (rows, adapters) of index contents.
void fill_buffer(uint8_t *p, size_t bytes, int32_t acl, Fill kind, uint8_t mode, int64_t bound,
                 Rng &r);

// ---------------------------------------------------------------------------------------------
// The world of one fuzz input: buffers, tensors, snapshots
// ---------------------------------------------------------------------------------------------

struct Created {
  TensorSpec spec;
  Fill kind = Fill::kRandom;
  aclTensor *t = nullptr;  // null once destroyed
  bool created = false;    // aclCreateTensor accepted it
  int buf = -1;            // the buffer it lies in (-1: none)
  size_t data_off = 0;     // the data pointer's byte offset in the buffer's payload
  size_t esize = 1;        // the library's element size
  bool nonempty = false;   // every size > 0
  bool storage_given = false;
  __int128 lo = 0, hi = 0;  // the elements reached, relative to the data pointer
  __int128 numel = 0;
};

// The status codes the library may return.
bool documented_status(int st);

// Every call is preceded by one that leaves a known message (poison()), so that a failure which
// records no message of its own is seen by check_status().
const std::string &poison_message();
void poison();
void check_status(int st, const char *call);

// What the last input did (for the seed writer's self-check).
struct Outcome {
  int phase1 = -1;  // -1: not reached
  int phase2 = -1;
};
extern Outcome g_outcome;

// True when the elements a and b are equal, or both NaN (float types).
bool same_float(const uint8_t *a, const uint8_t *b, int32_t acl);

class World {
 public:
  explicit World(uint64_t seed) : rng_{seed} {}
  ~World() { destroy_tensors(); }
  World(const World &) = delete;
  World &operator=(const World &) = delete;

  // Allocates (or aliases) the buffer of a tensor, fills it, creates the aclTensor and checks
  // aclCreateTensor's answer. `bound` is the index bound (rows, adapters) for index contents.
  aclTensor *add(const TensorSpec &s, Fill kind, int64_t bound = 0);

  // FUSEKIT_FUZZ_DEBUG=1: one line per tensor, and its first elements as floats.
  void debug_print(const Created &c) const;

  const Created &tensor(int i) const { return tensors_[i]; }
  int num_tensors() const { return static_cast<int>(tensors_.size()); }
  Buffer &buffer(int i) { return *buffers_[i]; }

  // The sum of the logical sizes of all tensors (saturating): phase two is skipped above a cap.
  __int128 work() const;

  void destroy_tensors();

  void snapshot();
  // The payload of buffer `b` as it was at the snapshot.
  const uint8_t *before(int b) const { return snap_[b].data() + kGuard; }

  // Every byte of every buffer now, and the check that nothing changed since.
  std::vector<std::vector<uint8_t>> state() const;
  void expect_state(const std::vector<std::vector<uint8_t>> &st, const char *when) const;

  // Every byte of every buffer as at the snapshot.
  void expect_unchanged(const char *when) const;

  // Marks the element of tensor i at element offset `elem` (from its data pointer) as writable.
  void allow_element(int i, int64_t elem, size_t esize);

  // Calls f(logical index, element offset from the data pointer) for every element of tensor i in
  // row-major order. A written view with more elements than its buffer has bytes reaches some
  // element twice, which the library must have refused.
  void for_each_element(int i, const std::function<void(int64_t, int64_t)> &f) const;
  void allow_all(int i);

  // Every byte outside the allowed elements as at the snapshot; guard bytes intact.
  void expect_only_allowed_writes(const char *when) const;

  // Copies of every buffer as at the snapshot (for a reference run on the same layout).
  std::vector<std::unique_ptr<Buffer>> copies() const;

  // The fusekit::TensorView of tensor i over the buffers `in` (the library's view of it).
  fusekit::TensorView view(int i, std::vector<std::unique_ptr<Buffer>> &in) const;
  // Pointer to tensor i's element at element offset e, in the current buffers or the snapshot.
  const uint8_t *now_at(int i, int64_t e) const;
  const uint8_t *before_at(int i, int64_t e) const;
  // The integer (int32 or int64) of tensor i at element offset e, as at the snapshot.
  int64_t index_before(int i, int64_t e) const;

  // Compares the buffers with `ref`, copies of the snapshot on which a reference ran: the listed
  // elements (tensor, element offset) equal or both NaN, every other byte equal.
  void expect_same_as(std::vector<std::unique_ptr<Buffer>> &ref,
                      const std::vector<std::pair<int, int64_t>> &elems, const char *what) const;
  static uint32_t bits_of(const uint8_t *p, int32_t acl);

  const char *owner(size_t buf) const;

 private:
  Rng rng_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<Created> tensors_;
  std::vector<std::vector<uint8_t>> snap_;
  std::vector<std::vector<uint8_t>> allowed_;
};

// ---------------------------------------------------------------------------------------------
// The two phases
// ---------------------------------------------------------------------------------------------

enum PhaseOneCode : uint8_t { kP1Normal = 0, kP1NullWorkspaceSize = 248, kP1NullExecutor = 252 };
enum WorkspaceCode : uint8_t {
  kWsExact = 0,
  kWsShort = 192,      // one byte less than asked (must be refused when > 0)
  kWsNull = 208,       // a null pointer with the size asked (must be refused when > 0)
  kWsLarger = 224,     // 100 bytes more
  kWsMisaligned = 240  // a pointer 1..63 bytes past an aligned one, the size asked
};
enum StreamCode : uint8_t {
  kStreamNull = 0,
  kStreamLive = 192,
  kStreamDestroyed = 224,
  kStreamGarbage = 240
};
enum ExecutorCode : uint8_t {
  kExRun = 0,
  kExNullFirst = 192,       // phase two with a null executor first (161001), then the real one
  kExTwice = 208,           // phase two twice: the second is refused and writes nothing
  kExDestroyTensors = 224,  // the tensors destroyed between the phases
  kExDestroy = 240          // never run: aclDestroyAclOpExecutor, twice (the second refused)
};

struct Phases {
  uint8_t p1 = 0, ws = 0, stream = 0, ex = 0, threads = 0;
  uint64_t seed = 0;
};
Phases decode_phases(Input &in);
void apply_threads(const Phases &p);
// The stream of a StreamCode: null, a live one, a destroyed one, or a pointer to garbage.
aclrtStream stream_for(uint8_t code);

using PhaseTwoFn = aclnnStatus (*)(void *, uint64_t, aclOpExecutor *, aclrtStream);

// After a phase one that returned `st`: checks it, and runs phase two as `p` says. Returns true
// when phase two ran and succeeded (the caller then checks the outputs; allowed writes are marked
// by `mark` before the check).
bool run_phases(World &w, const Phases &p, int st, uint64_t ws_size, aclOpExecutor *ex,
                const char *op, PhaseTwoFn phase_two, const std::function<void()> &mark);

// The start of every operator target's run: the case decoded from the input, the outcome reset,
// the case's thread count applied.
template <class Case>
Case begin_case(const uint8_t *data, size_t size, void (*decode)(Input &, Case *)) {
  Input in(data, size);
  Case c;
  decode(in, &c);
  g_outcome = Outcome();
  apply_threads(c.ph);
  return c;
}

// ---------------------------------------------------------------------------------------------
// The reference check every operator's target ends with
// ---------------------------------------------------------------------------------------------

// The C++ API's reference implementation, one thread, run on `tensors` (views of copies of the
// inputs as at the snapshot) with `scalars`, must accept what the aclnn call accepted and give
// the bits the call wrote at `outputs` (any NaN for any NaN).
// The C++ API's whole sequence on `tensors`: the problem made and checked, a plan, its workspace
// (for the tensors' batch where the plan's workspace depends on it), one run. The status of the
// first step that refused, or of the run.
template <class Plan, class Problem, class Tensors, class Options, class Scalars>
fusekit::Status plan_and_run(const Tensors &tensors, const Options &o, const Scalars &scalars) {
  Problem problem;
  fusekit::Status s = Problem::make(tensors, o, &problem);
  if (s.ok()) s = problem.check(tensors);
  Plan plan;
  if (s.ok()) s = Plan::plan(problem, o, &plan);
  size_t bytes = 0;
  if (s.ok()) {
    if constexpr (requires { plan.workspace_size(tensors); }) {
      bytes = plan.workspace_size(tensors);
    } else {
      bytes = plan.workspace_size();
    }
  }
  std::vector<char> workspace(bytes);
  if (s.ok()) s = plan.run(tensors, scalars, workspace.data(), workspace.size());
  return s;
}

template <class Plan, class Problem, class Tensors, class Options, class Scalars>
void expect_reference(World &w, std::vector<std::unique_ptr<Buffer>> &copies,
                      const Tensors &tensors, Options o, const Scalars &scalars,
                      const std::vector<std::pair<int, int64_t>> &outputs, const char *op) {
  o.kernel = fusekit::KernelChoice::kReference;
  o.num_threads = 1;
  const fusekit::Status s = plan_and_run<Plan, Problem>(tensors, o, scalars);
  FZ_CHECK(s.ok(), "%s succeeded but the C++ reference refused: %s", op, s.message().c_str());
  w.expect_same_as(copies, outputs,
                   (std::string(op) + " against the reference implementation").c_str());
}

// Options the aclnn face cannot reach (the 8-bit optimizers' FP8 state format and lost-v guard):
// the implementation a plan picks with `o` and the reference implementation (one thread), each on
// its own copy of the buffers as at the snapshot, give the same bytes everywhere or the same
// refusal. `bind(buffers)` gives the tensors and scalars over those buffers.
template <class Plan, class Problem, class Options, class Bind>
void expect_implementations_agree(const World &w, Options o, Bind &&bind, const char *what) {
  auto run = [&](std::vector<std::unique_ptr<Buffer>> &bufs, const Options &opt) {
    const auto [tensors, scalars] = bind(bufs);
    return plan_and_run<Plan, Problem>(tensors, opt, scalars);
  };
  auto fast = w.copies(), ref = w.copies();
  const fusekit::Status a = run(fast, o);
  o.kernel = fusekit::KernelChoice::kReference;
  o.num_threads = 1;
  const fusekit::Status b = run(ref, o);
  FZ_CHECK(a.code() == b.code(), "%s: the plan's implementation says \"%s\", the reference \"%s\"",
           what, a.message().c_str(), b.message().c_str());
  for (size_t i = 0; i < fast.size(); ++i) {
    FZ_CHECK(fast[i]->size == ref[i]->size &&
                 std::memcmp(fast[i]->payload(), ref[i]->payload(), fast[i]->size) == 0,
             "%s: buffer %zu differs between the plan's implementation and the reference", what, i);
  }
}

// ---------------------------------------------------------------------------------------------
// Seeds
// ---------------------------------------------------------------------------------------------

// A seed's values: `base` with `extra` on top.
Values with(const Values &base, const Values &extra);

enum class Expect { kAny, kPhaseOneFails, kPhaseTwoFails, kSucceeds };
struct Seed {
  const char *name;
  Expect expect;
  Values values;
  const char *finding = nullptr;  // the reproducer of this known finding: not run when avoided
};

using DecodeFn = void (*)(Input &);
using RunFn = void (*)(const uint8_t *, size_t);

// With FUSEKIT_FUZZ_WRITE_SEEDS=dir in the environment: encodes each seed with the target's own
// decoder, writes it to dir/<name>, runs it and checks the expected outcome, then exits.
void maybe_write_seeds(const std::vector<Seed> &seeds, DecodeFn decode, RunFn run);

// ---- the sparse-row optimizers (LazyAdam, LazyAdamQuant) ----
// The distinct valid rows of index tensor `idx` into table `table` (rows >= 0 and < its first
// dimension), in order of first occurrence, with their positions in the batch.
struct TouchedRows {
  std::vector<int64_t> order;
  std::map<int64_t, std::vector<int64_t>> occurrences;  // row -> positions k in the batch
};
TouchedRows touched_rows(const World &w, int idx, int table);

// The element offset (from the data pointer) of [row, j] of 2-D tensor t.
int64_t elem2(const World &w, int t, int64_t row, int64_t j);

}  // namespace fz

// The libFuzzer entry points of a target: its seeds (written and checked when
// FUSEKIT_FUZZ_WRITE_SEEDS is set), its decoder and its run.
#define FZ_FUZZ_TARGET(seeds, decode, run)                                  \
  extern "C" int LLVMFuzzerInitialize(int *, char ***) {                    \
    fz::maybe_write_seeds(seeds(), decode, run);                            \
    return 0;                                                               \
  }                                                                         \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { \
    run(data, size);                                                        \
    return 0;                                                               \
  }

#endif  // FUSEKIT_FUZZ_FUZZ_COMMON_H_
