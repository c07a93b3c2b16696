// The part of ONNX Runtime's C ABI a custom-op library needs, declared here because the Python
// wheel ships no headers (include/onnxruntime/core/session/onnxruntime_c_api.h of
// microsoft/onnxruntime). `OrtApi` is a table of function pointers that only ever grows at its end,
// so an entry's position is fixed once released: the positions named in `OrtApiIndex` up to 101
// are the first version's, checked against that header at commit
// 44885662608f431f1dfd7684b08431ca6f6f1893; KernelContext_ParallelFor (274, "since 1.17" in the
// header's own comment) comes from the table's byte offsets in a binding generated from a later
// header, which place entries 90 and 91 where that commit does. `OrtCustomOp` is declared up to
// GetEndVersion, the fields of its version 17 (the header's later releases append GetMayInplace, ReleaseMayInplace,
// GetAliasMap and ReleaseAliasMap, read only from version 18 on): ONNX Runtime 1.32 reads the
// characteristic and variadic callbacks whatever `version` a library sets, so the first version's
// ten fields alone are not enough. tests/runtime/test_ort_ops.py runs the library in the installed
// ONNX Runtime.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

struct OrtStatus;
struct OrtApi;
struct OrtValue;
struct OrtKernelInfo;
struct OrtKernelContext;
struct OrtSessionOptions;
struct OrtCustomOpDomain;
struct OrtTensorTypeAndShapeInfo;
struct OrtShapeInferContext;

enum OrtErrorCode { ORT_OK = 0, ORT_FAIL = 1, ORT_INVALID_ARGUMENT = 2 };
enum ONNXTensorElementDataType { ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED = 0, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT = 1 };
enum OrtCustomOpInputOutputCharacteristic { INPUT_OUTPUT_REQUIRED = 0, INPUT_OUTPUT_OPTIONAL = 1,
                                            INPUT_OUTPUT_VARIADIC = 2 };
enum OrtMemType { OrtMemTypeCPUInput = -2, OrtMemTypeCPUOutput = -1, OrtMemTypeDefault = 0 };

struct OrtApiBase {
    const OrtApi* (*GetApi)(uint32_t version);
    const char* (*GetVersionString)();
};

struct OrtCustomOp {
    uint32_t version;
    void* (*CreateKernel)(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info);
    const char* (*GetName)(const OrtCustomOp* op);
    const char* (*GetExecutionProviderType)(const OrtCustomOp* op);
    ONNXTensorElementDataType (*GetInputType)(const OrtCustomOp* op, size_t index);
    size_t (*GetInputTypeCount)(const OrtCustomOp* op);
    ONNXTensorElementDataType (*GetOutputType)(const OrtCustomOp* op, size_t index);
    size_t (*GetOutputTypeCount)(const OrtCustomOp* op);
    void (*KernelCompute)(void* kernel, OrtKernelContext* context);
    void (*KernelDestroy)(void* kernel);
    OrtCustomOpInputOutputCharacteristic (*GetInputCharacteristic)(const OrtCustomOp* op, size_t index);
    OrtCustomOpInputOutputCharacteristic (*GetOutputCharacteristic)(const OrtCustomOp* op, size_t index);
    OrtMemType (*GetInputMemoryType)(const OrtCustomOp* op, size_t index);
    int (*GetVariadicInputMinArity)(const OrtCustomOp* op);
    int (*GetVariadicInputHomogeneity)(const OrtCustomOp* op);
    int (*GetVariadicOutputMinArity)(const OrtCustomOp* op);
    int (*GetVariadicOutputHomogeneity)(const OrtCustomOp* op);
    OrtStatus* (*CreateKernelV2)(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info, void** kernel);
    OrtStatus* (*KernelComputeV2)(void* kernel, OrtKernelContext* context);
    OrtStatus* (*InferOutputShapeFn)(const OrtCustomOp* op, OrtShapeInferContext* context);
    int (*GetStartVersion)(const OrtCustomOp* op);
    int (*GetEndVersion)(const OrtCustomOp* op);
};

}  // extern "C"

// Positions in the OrtApi table.
enum OrtApiIndex : size_t {
    kCreateStatus = 0,
    kCreateCustomOpDomain = 26,
    kCustomOpDomain_Add = 27,
    kAddCustomOpDomain = 28,
    kGetTensorMutableData = 51,
    kGetDimensionsCount = 61,
    kGetDimensions = 62,
    kGetTensorTypeAndShape = 65,
    kKernelContext_GetInput = 90,
    kKernelContext_GetOutput = 91,
    kReleaseTensorTypeAndShapeInfo = 99,
    // Added in version 17 (ONNX Runtime 1.17), the version the library asks for; at byte offset 2192
    // of the table, after SetDeterministicCompute (273).
    kKernelContext_ParallelFor = 274,
};

// The version the library asks for: the oldest that has every entry above and OrtCustomOp's v17 fields.
constexpr uint32_t kOrtApiVersion = 17;

// Typed access to the table: api_fn<Signature>(api, index).
template <typename Fn>
inline Fn api_fn(const OrtApi* api, size_t index) {
    return reinterpret_cast<Fn>(reinterpret_cast<void* const*>(api)[index]);
}
