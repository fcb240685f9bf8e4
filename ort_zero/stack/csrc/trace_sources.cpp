// The TorchScript tracer's source-location callback for ort_zero's exports: torch's own callback, called only for
// the nodes whose source ranges torch's ONNX passes compare; every other node records no source range.
//
// torch's callback walks the whole Python stack and formats it into every traced node, about a third of an export's
// time. The in-place passes (index_put/copy_ encapsulation) group an indexing expression by comparing the source
// ranges of the slice/select chain with the in-place node at its end, and dereference them: those nodes keep torch's.
#include <torch/csrc/jit/ir/ir.h>

#include <cstring>

namespace {

using Recorder = void (*)(torch::jit::Node*);

Recorder torchs_recorder = nullptr;

bool ends_with_underscore(const char* name) {
  const size_t length = std::strlen(name);
  return length > 0 && name[length - 1] == '_';
}

// slice/select chains end in an in-place aten op (index_put_, copy_, fill_, ...) or in index_put.
bool compared_by_onnx_passes(const torch::jit::Node* node) {
  const c10::Symbol kind = node->kind();
  if (kind == c10::aten::slice || kind == c10::aten::select || kind == c10::aten::index_put) {
    return true;
  }
  return kind.is_aten() && ends_with_underscore(kind.toUnqualString());
}

}  // namespace

extern "C" {

// The callback torch's tracer calls once it is installed (torch::jit::tracer::setRecordSourceLocation).
void ort_zero_record_compared_sources(torch::jit::Node* node) {
  if (torchs_recorder != nullptr && compared_by_onnx_passes(node)) {
    torchs_recorder(node);
  }
}

// torch's callback, as it was before ort_zero's was installed.
void ort_zero_set_torch_recorder(Recorder recorder) {
  torchs_recorder = recorder;
}

}  // extern "C"
