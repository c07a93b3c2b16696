// cosycompile.Snake(x, alpha, scale) = x + scale * sin(alpha * x)^2, per channel, in one pass.
//
// HiFT applies Snake after every convolution of its residual blocks. Exported to ONNX it is Mul ->
// Sin -> Pow -> Mul -> Add, and ONNX Runtime's CPU Sin is a scalar loop on one thread: the chain
// costs HiFT more than its convolutions do. Here sin^2 comes from a reduction to [-pi/2, pi/2]
// (y - k pi, pi in two parts; the sign k flips drops out when squared) and an odd polynomial of
// degree 9 fitted to sin there (relative error under 1e-8, below float32's rounding), which the
// compiler vectorizes. The loop is compiled for three ISA levels and the loader picks the one this
// CPU runs, so a library built on one x86-64 machine runs on any other.
//
// x is [..., C, T] float32; alpha and scale hold one value per channel (C) or one for all. Rows go
// out in blocks through KernelContext_ParallelFor, i.e. to the session's own intra-op pool (the one
// that runs the convolutions around the op): a second threading runtime in the process would spin
// against that pool on a small machine.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>

#include "ort_abi.h"

namespace {

const OrtApi* g_api = nullptr;

constexpr float kInvPi = 0.318309886183790671f;
constexpr float kPiHi = 3.140625f;                   // 8 significant bits: k * kPiHi is exact for |k| < 2^16
constexpr float kPiLo = 9.67653589793e-4f;           // pi - kPiHi
constexpr float kRound = 12582912.0f;                // 1.5 * 2^23: (v + kRound) - kRound rounds v to an integer
constexpr float kS1 = 0.99999999571584f, kS3 = -0.1666665796990471f, kS5 = 0.00833305061732816f,
                kS7 = -0.00019809046357388826f, kS9 = 2.605166275720759e-06f;

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void snake_row(const float* x, float* y, size_t n, float alpha, float scale) {
    for (size_t i = 0; i < n; ++i) {
        const float v = x[i];
        const float t = alpha * v;
        const float k = (t * kInvPi + kRound) - kRound;
        const float r = (t - k * kPiHi) - k * kPiLo;
        const float r2 = r * r;
        const float s = r * (kS1 + r2 * (kS3 + r2 * (kS5 + r2 * (kS7 + r2 * kS9))));
        y[i] = v + scale * (s * s);
    }
}

using CreateStatusFn = OrtStatus* (*)(OrtErrorCode, const char*);
using GetInputFn = OrtStatus* (*)(const OrtKernelContext*, size_t, const OrtValue**);
using GetOutputFn = OrtStatus* (*)(OrtKernelContext*, size_t, const int64_t*, size_t, OrtValue**);
using GetTypeAndShapeFn = OrtStatus* (*)(const OrtValue*, OrtTensorTypeAndShapeInfo**);
using GetDimensionsCountFn = OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, size_t*);
using GetDimensionsFn = OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, int64_t*, size_t);
using ReleaseShapeFn = void (*)(OrtTensorTypeAndShapeInfo*);
using GetMutableDataFn = OrtStatus* (*)(OrtValue*, void**);

OrtStatus* fail(const char* message) {
    return api_fn<CreateStatusFn>(g_api, kCreateStatus)(ORT_INVALID_ARGUMENT, message);
}

constexpr size_t kMaxRank = 8;

// The dims of a tensor input (at most kMaxRank of them).
OrtStatus* shape_of(const OrtValue* value, int64_t* dims, size_t* rank) {
    OrtTensorTypeAndShapeInfo* info = nullptr;
    if (OrtStatus* s = api_fn<GetTypeAndShapeFn>(g_api, kGetTensorTypeAndShape)(value, &info)) return s;
    OrtStatus* s = api_fn<GetDimensionsCountFn>(g_api, kGetDimensionsCount)(info, rank);
    if (!s && *rank > kMaxRank) s = fail("cosycompile.Snake: input of rank above 8");
    if (!s) s = api_fn<GetDimensionsFn>(g_api, kGetDimensions)(info, dims, *rank);
    api_fn<ReleaseShapeFn>(g_api, kReleaseTensorTypeAndShapeInfo)(info);
    return s;
}

OrtStatus* data_of(const OrtValue* value, float** data) {
    void* p = nullptr;
    OrtStatus* s = api_fn<GetMutableDataFn>(g_api, kGetTensorMutableData)(const_cast<OrtValue*>(value), &p);
    *data = static_cast<float*>(p);
    return s;
}

size_t count(const int64_t* dims, size_t rank) {
    size_t n = 1;
    for (size_t i = 0; i < rank; ++i) n *= static_cast<size_t>(dims[i]);
    return n;
}

// One call's rows, cut into blocks of `block` rows for the pool.
struct Rows {
    const float* x;
    float* y;
    const float* alpha;
    const float* scale;
    size_t steps, channels, na, ns, rows, block;
};

// Rows per block: about this many elements, so that a block outweighs handing it to a pool thread,
// while the Snakes of HiFT's first level (256 channels of a few thousand steps) still split into
// dozens of blocks.
constexpr size_t kBlockElements = 16384;

void run_block(void* data, size_t index) {
    const Rows& j = *static_cast<const Rows*>(data);
    const size_t end = std::min(j.rows, (index + 1) * j.block);
    for (size_t r = index * j.block; r < end; ++r) {
        const size_t c = j.channels ? r % j.channels : 0;
        snake_row(j.x + r * j.steps, j.y + r * j.steps, j.steps, j.alpha[j.na == 1 ? 0 : c],
                  j.scale[j.ns == 1 ? 0 : c]);
    }
}

using ParallelForFn = OrtStatus* (*)(const OrtKernelContext*, void (*)(void*, size_t), size_t, size_t, void*);

OrtStatus* compute(void* /*kernel*/, OrtKernelContext* context) {
    const OrtValue* in[3];
    int64_t dims[3][kMaxRank];
    size_t rank[3];
    for (size_t i = 0; i < 3; ++i) {
        if (OrtStatus* s = api_fn<GetInputFn>(g_api, kKernelContext_GetInput)(context, i, &in[i])) return s;
        if (OrtStatus* s = shape_of(in[i], dims[i], &rank[i])) return s;
    }
    if (rank[0] < 2) return fail("cosycompile.Snake: x must be [..., C, T]");
    const size_t channels = static_cast<size_t>(dims[0][rank[0] - 2]);
    const size_t steps = static_cast<size_t>(dims[0][rank[0] - 1]);
    const size_t na = count(dims[1], rank[1]), ns = count(dims[2], rank[2]);
    if ((na != 1 && na != channels) || (ns != 1 && ns != channels))
        return fail("cosycompile.Snake: alpha and scale must hold one value or one per channel");
    OrtValue* out = nullptr;
    if (OrtStatus* s = api_fn<GetOutputFn>(g_api, kKernelContext_GetOutput)(context, 0, dims[0], rank[0], &out))
        return s;
    float *x, *alpha, *scale, *y;
    if (OrtStatus* s = data_of(in[0], &x)) return s;
    if (OrtStatus* s = data_of(in[1], &alpha)) return s;
    if (OrtStatus* s = data_of(in[2], &scale)) return s;
    if (OrtStatus* s = data_of(out, &y)) return s;
    Rows job{x, y, alpha, scale, steps, channels, na, ns, steps ? count(dims[0], rank[0]) / steps : 0, 0};
    if (job.rows == 0) return nullptr;
    job.block = (kBlockElements + steps - 1) / steps;
    const size_t blocks = (job.rows + job.block - 1) / job.block;
    return api_fn<ParallelForFn>(g_api, kKernelContext_ParallelFor)(context, run_block, blocks, 0, &job);
}

struct Kernel {};

OrtStatus* create_kernel(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*, void** kernel) {
    *kernel = new (std::nothrow) Kernel;
    return *kernel ? nullptr : fail("cosycompile.Snake: out of memory");
}

void destroy_kernel(void* kernel) { delete static_cast<Kernel*>(kernel); }
const char* op_name(const OrtCustomOp*) { return "Snake"; }
const char* op_provider(const OrtCustomOp*) { return "CPUExecutionProvider"; }
ONNXTensorElementDataType float_type(const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
size_t three(const OrtCustomOp*) { return 3; }
size_t one(const OrtCustomOp*) { return 1; }
OrtCustomOpInputOutputCharacteristic required(const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; }
OrtMemType default_memory(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
int arity(const OrtCustomOp*) { return 1; }
int homogeneous(const OrtCustomOp*) { return 1; }
int start_version(const OrtCustomOp*) { return 1; }
int end_version(const OrtCustomOp*) { return 0x7fffffff; }

OrtCustomOp make_snake() {
    OrtCustomOp op;
    std::memset(&op, 0, sizeof op);
    op.version = kOrtApiVersion;
    op.GetName = op_name;
    op.GetExecutionProviderType = op_provider;
    op.GetInputType = float_type;
    op.GetInputTypeCount = three;
    op.GetOutputType = float_type;
    op.GetOutputTypeCount = one;
    op.KernelDestroy = destroy_kernel;
    op.GetInputCharacteristic = required;
    op.GetOutputCharacteristic = required;
    op.GetInputMemoryType = default_memory;
    op.GetVariadicInputMinArity = arity;
    op.GetVariadicInputHomogeneity = homogeneous;
    op.GetVariadicOutputMinArity = arity;
    op.GetVariadicOutputHomogeneity = homogeneous;
    op.CreateKernelV2 = create_kernel;
    op.KernelComputeV2 = compute;
    op.GetStartVersion = start_version;
    op.GetEndVersion = end_version;
    return op;
}

const OrtCustomOp kSnake = make_snake();

}  // namespace

// Called by SessionOptions.register_custom_ops_library: adds the "cosycompile" domain with Snake.
extern "C" __attribute__((visibility("default"))) OrtStatus* RegisterCustomOps(OrtSessionOptions* options,
                                                                                 const OrtApiBase* base) {
    g_api = base->GetApi(kOrtApiVersion);
    if (!g_api) {  // an ONNX Runtime older than the table this library reads
        const OrtApi* first = base->GetApi(1);
        return api_fn<CreateStatusFn>(first, kCreateStatus)(ORT_FAIL, "cosycompile ops need ONNX Runtime 1.17 or later");
    }
    using CreateDomainFn = OrtStatus* (*)(const char*, OrtCustomOpDomain**);
    using DomainAddFn = OrtStatus* (*)(OrtCustomOpDomain*, const OrtCustomOp*);
    using AddDomainFn = OrtStatus* (*)(OrtSessionOptions*, OrtCustomOpDomain*);
    OrtCustomOpDomain* domain = nullptr;  // lives as long as the process: sessions keep pointing at it
    if (OrtStatus* s = api_fn<CreateDomainFn>(g_api, kCreateCustomOpDomain)("cosycompile", &domain)) return s;
    if (OrtStatus* s = api_fn<DomainAddFn>(g_api, kCustomOpDomain_Add)(domain, &kSnake)) return s;
    return api_fn<AddDomainFn>(g_api, kAddCustomOpDomain)(options, domain);
}
