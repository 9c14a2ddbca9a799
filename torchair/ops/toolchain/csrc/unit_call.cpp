// unit_call: the per-call work around Inductor's C++-wrapper entry, as one C++ call.
//
// A static CPU unit compiled without Inductor's per-input asserts checks its inputs itself
// (torchair/runtime/input_layout.py) and then hands Inductor's compiled entry a list of tensor
// handles. In Python that is PyTorch's TensorGuards comparison (about 0.1 us per input) and
// PyTorch's handle conversion (about 0.07 us per input): a decode step's 50 weights and inputs
// cost some 9 us a call before the entry runs. Here both are one loop over the inputs.
//
// A Python extension module (torchair_unit_call):
//   layout(tensor_type, tensors) -> capsule: the dtype, device, sizes and strides of each tensor
//     (the layout a unit was compiled for);
//   check(layout, args) -> whether every argument is a plain strided tensor of the layout's dtype,
//     device, sizes and strides (a size-1 dimension's stride and an empty tensor's strides are
//     not compared, as Inductor's assert does not);
//   entry(path, symbol, outputs) -> capsule: the C++ entry function of an Inductor module already
//     loaded in this process;
//   run(layout, entry, args) -> the output handles, or None without running when check() fails
//     (the caller's Python check then says which input, and raises). Each argument becomes a new
//     tensor handle (a heap at::Tensor sharing the argument's TensorImpl), which the entry steals;
//   init(tensor, handle), probe(type, tensor): the loader's check of how tensor objects are read.
//
// A Python tensor object is read as PyTorch lays it out: the object header, then the tensor (an
// at::Tensor, or a c10::MaybeOwned<at::Tensor> in older PyTorch). init() finds which one by
// comparing raw words with a handle PyTorch made for the same tensor; the loader
// (torchair/runtime/unit_call.py) then checks the reading on probe tensors before any use.
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <c10/util/MaybeOwned.h>

#include <dlfcn.h>

#include <cstdint>
#include <exception>
#include <vector>

namespace {

// how a Python tensor object holds its tensor, right after the object header: 1: an at::Tensor
// (newer PyTorch), 2: a c10::MaybeOwned<at::Tensor> (older); 0: not known (set by
// init, which compares both readings with a handle PyTorch itself made)
int g_holding = 0;

struct Spec {
  c10::ScalarType dtype;
  c10::Device device;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  bool empty;
};

struct Layout {
  PyTypeObject* tensor_type;
  std::vector<Spec> specs;
};

const char* kLayout = "torchair_unit_call.layout";

void free_layout(PyObject* capsule) {
  delete static_cast<Layout*>(PyCapsule_GetPointer(capsule, kLayout));
}

const char* payload(PyObject* obj) { return reinterpret_cast<const char*>(obj) + sizeof(PyObject); }

const at::Tensor* unpack(PyTypeObject* type, PyObject* obj) {
  if (!PyObject_TypeCheck(obj, type)) {
    return nullptr;
  }
  if (g_holding == 1) {
    return reinterpret_cast<const at::Tensor*>(payload(obj));
  }
  if (g_holding == 2) {
    return &**reinterpret_cast<const c10::MaybeOwned<at::Tensor>*>(payload(obj));
  }
  return nullptr;
}

bool fits(const at::Tensor& t, const Spec& spec) {
  if (t.scalar_type() != spec.dtype || t.device() != spec.device || t.is_nested() ||
      t.layout() != c10::kStrided) {
    return false;
  }
  auto sizes = t.sizes();
  if (sizes.size() != spec.sizes.size()) {
    return false;
  }
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] != spec.sizes[d]) {
      return false;
    }
  }
  if (spec.empty) {
    return true;
  }
  auto strides = t.strides();
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] > 1 && strides[d] != spec.strides[d]) {
      return false;
    }
  }
  return true;
}

PyObject* layout(PyObject*, PyObject* args) {
  PyObject* type;
  PyObject* tensors;
  if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &type, &PyList_Type, &tensors)) {
    return nullptr;
  }
  if (g_holding == 0) {
    PyErr_SetString(PyExc_RuntimeError, "layout: init() did not recognize tensor objects");
    return nullptr;
  }
  auto* out = new Layout{reinterpret_cast<PyTypeObject*>(type), {}};
  Py_ssize_t n = PyList_GET_SIZE(tensors);
  for (Py_ssize_t i = 0; i < n; ++i) {
    const at::Tensor* t = unpack(out->tensor_type, PyList_GET_ITEM(tensors, i));
    if (t == nullptr) {
      delete out;
      PyErr_Format(PyExc_TypeError, "layout: argument %zd is not a tensor", i);
      return nullptr;
    }
    out->specs.push_back(Spec{t->scalar_type(), t->device(), t->sizes().vec(),
                              t->strides().vec(), t->numel() == 0});
  }
  Py_INCREF(type);  // kept for the life of the process (torch.Tensor)
  return PyCapsule_New(out, kLayout, free_layout);
}

bool all_fit(const Layout& lay, PyObject* items, std::vector<const at::Tensor*>* tensors) {
  Py_ssize_t n = PyList_GET_SIZE(items);
  if (static_cast<size_t>(n) != lay.specs.size()) {
    return false;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    const at::Tensor* t = unpack(lay.tensor_type, PyList_GET_ITEM(items, i));
    if (t == nullptr || !fits(*t, lay.specs[i])) {
      return false;
    }
    if (tensors != nullptr) {
      (*tensors)[i] = t;
    }
  }
  return true;
}

PyObject* check(PyObject*, PyObject* args) {
  // check(layout, args) -> whether every argument is a tensor of the layout (what run checks)
  PyObject* capsule;
  PyObject* items;
  if (!PyArg_ParseTuple(args, "OO!", &capsule, &PyList_Type, &items)) {
    return nullptr;
  }
  auto* lay = static_cast<Layout*>(PyCapsule_GetPointer(capsule, kLayout));
  if (lay == nullptr) {
    return nullptr;
  }
  return PyBool_FromLong(all_fit(*lay, items, nullptr));
}

using EntryImpl = void (*)(void**, void**);  // Inductor's inductor_entry_impl(inputs, outputs)

const char* kEntry = "torchair_unit_call.entry";

struct Entry {
  EntryImpl impl;
  Py_ssize_t outputs;
};

void free_entry(PyObject* capsule) {
  delete static_cast<Entry*>(PyCapsule_GetPointer(capsule, kEntry));
}

PyObject* entry(PyObject*, PyObject* args) {
  // entry(library path, symbol, output count) -> capsule: the C++ entry of an Inductor
  // C++-wrapper module already loaded in this process (RTLD_NOLOAD: never loads a library), or
  // None when the library or the symbol is not there
  const char* path;
  const char* symbol;
  Py_ssize_t outputs;
  if (!PyArg_ParseTuple(args, "ssn", &path, &symbol, &outputs)) {
    return nullptr;
  }
  void* lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) {
    Py_RETURN_NONE;
  }
  void* impl = dlsym(lib, symbol);
  dlclose(lib);  // (the module keeps it loaded)
  if (impl == nullptr || outputs < 0) {
    Py_RETURN_NONE;
  }
  return PyCapsule_New(new Entry{reinterpret_cast<EntryImpl>(impl), outputs}, kEntry, free_entry);
}

PyObject* run(PyObject*, PyObject* args) {
  // run(layout, entry, args) -> a list of output handles (capsules, for PyTorch's
  // alloc_tensors_by_stealing_from_void_ptrs), or None without running when an argument is not a
  // tensor of the layout; the entry steals the input handles, as Inductor's own caller does
  PyObject* layout_capsule;
  PyObject* entry_capsule;
  PyObject* items;
  if (!PyArg_ParseTuple(args, "OOO!", &layout_capsule, &entry_capsule, &PyList_Type, &items)) {
    return nullptr;
  }
  auto* lay = static_cast<Layout*>(PyCapsule_GetPointer(layout_capsule, kLayout));
  auto* fn = static_cast<Entry*>(PyCapsule_GetPointer(entry_capsule, kEntry));
  if (lay == nullptr || fn == nullptr) {
    return nullptr;
  }
  Py_ssize_t n = PyList_GET_SIZE(items);
  std::vector<const at::Tensor*> tensors(n);
  if (!all_fit(*lay, items, &tensors)) {
    Py_RETURN_NONE;
  }
  std::vector<void*> inputs(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    inputs[i] = new at::Tensor(*tensors[i]);
  }
  std::vector<void*> outputs(fn->outputs, nullptr);
  try {
    fn->impl(inputs.data(), outputs.data());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unhandled error");
    return nullptr;
  }
  if (PyErr_Occurred()) {
    return nullptr;
  }
  PyObject* result = PyList_New(fn->outputs);
  if (result == nullptr) {
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < fn->outputs; ++i) {
    PyObject* item = outputs[i] == nullptr
                         ? Py_NewRef(Py_None)
                         : PyCapsule_New(outputs[i], nullptr, nullptr);
    PyList_SET_ITEM(result, i, item);
  }
  return result;
}

PyObject* init(PyObject*, PyObject* args) {
  // init(tensor, handle): which holding a tensor object uses, from the raw words after its
  // header compared with the TensorImpl of ``handle`` (a capsule of PyTorch's own at::Tensor*
  // for the same tensor, deleted here); True when one of the two readings matches
  PyObject* obj;
  PyObject* handle;
  if (!PyArg_ParseTuple(args, "OO", &obj, &handle)) {
    return nullptr;
  }
  auto* tensor = static_cast<at::Tensor*>(PyCapsule_GetPointer(handle, nullptr));
  if (tensor == nullptr) {
    return nullptr;
  }
  const void* impl = tensor->unsafeGetTensorImpl();
  delete tensor;
  const char* base = payload(obj);
  const void* first = *reinterpret_cast<const void* const*>(base);
  const void* second = *reinterpret_cast<const void* const*>(base + sizeof(void*));
  if (first == impl) {
    g_holding = 1;
  } else if ((base[0] == 0 || base[0] == 1) && second == impl) {
    g_holding = 2;  // MaybeOwned: a flag, then the tensor (owned or borrowed, both hold the impl)
  } else {
    g_holding = 0;
  }
  return PyBool_FromLong(g_holding != 0);
}

PyObject* probe(PyObject*, PyObject* args) {
  // (data pointer, sizes, strides) of a tensor as read here, for the loader's layout check
  PyObject* type;
  PyObject* obj;
  if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &type, &obj)) {
    return nullptr;
  }
  const at::Tensor* t = unpack(reinterpret_cast<PyTypeObject*>(type), obj);
  if (t == nullptr) {
    Py_RETURN_NONE;
  }
  PyObject* sizes = PyTuple_New(t->dim());
  PyObject* strides = PyTuple_New(t->dim());
  for (int64_t d = 0; d < t->dim(); ++d) {
    PyTuple_SET_ITEM(sizes, d, PyLong_FromLongLong(t->sizes()[d]));
    PyTuple_SET_ITEM(strides, d, PyLong_FromLongLong(t->strides()[d]));
  }
  return Py_BuildValue("(KNN)", static_cast<unsigned long long>(
                                    reinterpret_cast<uintptr_t>(t->data_ptr())),
                       sizes, strides);
}

PyMethodDef methods[] = {
    {"layout", layout, METH_VARARGS, "the layout of a list of tensors (a capsule)"},
    {"check", check, METH_VARARGS, "whether the arguments fit a layout"},
    {"probe", probe, METH_VARARGS, "(data pointer, sizes, strides) of a tensor"},
    {"init", init, METH_VARARGS, "learn how tensor objects hold their tensor"},
    {"entry", entry, METH_VARARGS, "the C++ entry of a loaded Inductor module (a capsule)"},
    {"run", run, METH_VARARGS, "check the arguments against a layout, run the C++ entry"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "torchair_unit_call", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_torchair_unit_call() { return PyModule_Create(&module); }
