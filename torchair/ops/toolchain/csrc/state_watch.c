/* state_watch: whether some dicts and objects are unchanged since they were recorded, in one call.
 *
 * CPython gives every dict a version tag that changes on every change to the dict (PEP 509; still
 * kept, though deprecated, up to 3.13), and every type a version tag that changes when the type or
 * one of its bases is modified. A served cache_compile call reads module state (submodules,
 * attributes such as a norm's eps, parameters) through a chain of dicts; while every dict of the
 * chain keeps its tag and every object on it its type, the chain yields the same objects, so the
 * values read last time serve again (torchair/inference/guards/hoist.py). In a decode loop that
 * saves a few dozen dependent Python lookups, each of which runs with the caches the step's
 * weights evicted.
 *
 * A Python extension module (torchair_state_watch), loaded by torchair/runtime/unit_call.py after
 * a probe of this Python's tags:
 *   watch(dicts, objects) -> capsule, or None where this Python keeps no dict tags or an object's
 *     type has no valid tag: the tag of each dict (exact dicts only) and the type and type tag of
 *     each object, holding a reference to each;
 *   unchanged(watch) -> whether every dict has its tag and every object its type and type tag;
 *   first_with(values, indices, name) -> the first index i of indices whose values[i] has an
 *     attribute `name` that is not None (as getattr(values[i], name, None)), else -1: a served
 *     call's check that no argument tensor carries set_dim_gears marks, in one loop.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
#define TORCHAIR_DICT_TAGS 1
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
static uint64_t dict_tag(PyObject *d) { return ((PyDictObject *)d)->ma_version_tag; }
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#endif

typedef struct {
    Py_ssize_t ndicts, nobjects;
    PyObject **dicts;        /* [ndicts], each referenced */
    uint64_t *tags;          /* [ndicts] */
    PyObject **objects;      /* [nobjects], each referenced */
    PyTypeObject **types;    /* [nobjects], each referenced */
    unsigned int *type_tags; /* [nobjects] */
} watch_t;

static const char *WATCH = "torchair_state_watch.watch";

static void release(watch_t *w) {
    for (Py_ssize_t i = 0; i < w->ndicts; i++) Py_XDECREF(w->dicts[i]);
    for (Py_ssize_t i = 0; i < w->nobjects; i++) {
        Py_XDECREF(w->objects[i]);
        Py_XDECREF((PyObject *)w->types[i]);
    }
    free(w->dicts);
    free(w->tags);
    free(w->objects);
    free(w->types);
    free(w->type_tags);
    free(w);
}

static void free_watch(PyObject *capsule) {
    watch_t *w = (watch_t *)PyCapsule_GetPointer(capsule, WATCH);
    if (w != NULL) release(w);
}

static PyObject *watch(PyObject *self, PyObject *args) {
    PyObject *dicts, *objects;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &dicts, &PyTuple_Type, &objects))
        return NULL;
#ifdef TORCHAIR_DICT_TAGS
    Py_ssize_t nd = PyTuple_GET_SIZE(dicts), no = PyTuple_GET_SIZE(objects);
    for (Py_ssize_t i = 0; i < nd; i++) {
        if (!PyDict_CheckExact(PyTuple_GET_ITEM(dicts, i))) {
            PyErr_SetString(PyExc_TypeError, "watch: every dict must be a dict (not a subclass)");
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < no; i++)
        if (Py_TYPE(PyTuple_GET_ITEM(objects, i))->tp_version_tag == 0)
            Py_RETURN_NONE; /* a type without a valid tag: nothing to compare with */
    watch_t *w = (watch_t *)calloc(1, sizeof(watch_t));
    if (w == NULL) return PyErr_NoMemory();
    w->dicts = (PyObject **)calloc(nd + 1, sizeof(PyObject *));
    w->tags = (uint64_t *)calloc(nd + 1, sizeof(uint64_t));
    w->objects = (PyObject **)calloc(no + 1, sizeof(PyObject *));
    w->types = (PyTypeObject **)calloc(no + 1, sizeof(PyTypeObject *));
    w->type_tags = (unsigned int *)calloc(no + 1, sizeof(unsigned int));
    if (!w->dicts || !w->tags || !w->objects || !w->types || !w->type_tags) {
        release(w);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < nd; i++) {
        PyObject *d = PyTuple_GET_ITEM(dicts, i);
        Py_INCREF(d);
        w->dicts[i] = d;
        w->tags[i] = dict_tag(d);
        w->ndicts = i + 1;
    }
    for (Py_ssize_t i = 0; i < no; i++) {
        PyObject *o = PyTuple_GET_ITEM(objects, i);
        PyTypeObject *type = Py_TYPE(o);
        Py_INCREF(o);
        Py_INCREF((PyObject *)type);
        w->objects[i] = o;
        w->types[i] = type;
        w->type_tags[i] = type->tp_version_tag;
        w->nobjects = i + 1;
    }
    PyObject *capsule = PyCapsule_New(w, WATCH, free_watch);
    if (capsule == NULL) release(w);
    return capsule;
#else
    (void)dicts;
    (void)objects;
    Py_RETURN_NONE;
#endif
}

static PyObject *unchanged(PyObject *self, PyObject *capsule) {
    (void)self;
    watch_t *w = (watch_t *)PyCapsule_GetPointer(capsule, WATCH);
    if (w == NULL) return NULL;
#ifdef TORCHAIR_DICT_TAGS
    int same = 1;
    /* every tag read without stopping at the first change: independent loads, which the CPU
     * overlaps when the dicts are not in cache */
    for (Py_ssize_t i = 0; i < w->ndicts; i++) same &= dict_tag(w->dicts[i]) == w->tags[i];
    for (Py_ssize_t i = 0; i < w->nobjects; i++) {
        PyTypeObject *type = Py_TYPE(w->objects[i]);
        same &= type == w->types[i] && type->tp_version_tag == w->type_tags[i];
    }
    return PyBool_FromLong(same);
#else
    Py_RETURN_FALSE;
#endif
}

static PyObject *first_with(PyObject *self, PyObject *args) {
    PyObject *values, *indices, *name;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!U", &PyList_Type, &values, &PyTuple_Type, &indices, &name))
        return NULL;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(indices); j++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(indices, j));
        if (i == -1 && PyErr_Occurred()) return NULL;
        if (i < 0 || i >= PyList_GET_SIZE(values)) {
            PyErr_SetString(PyExc_IndexError, "first_with: index out of range");
            return NULL;
        }
        PyObject *found = NULL;
#if PY_VERSION_HEX >= 0x030D0000
        int rc = PyObject_GetOptionalAttr(PyList_GET_ITEM(values, i), name, &found);
#else
        int rc = _PyObject_LookupAttr(PyList_GET_ITEM(values, i), name, &found);
#endif
        if (rc < 0) return NULL;
        int marked = found != NULL && found != Py_None;
        Py_XDECREF(found);
        if (marked) return PyLong_FromSsize_t(i);
    }
    return PyLong_FromLong(-1);
}

static PyMethodDef methods[] = {
    {"first_with", first_with, METH_VARARGS, "the first value with a non-None attribute, or -1"},
    {"watch", watch, METH_VARARGS, "the version tags of dicts and the types of objects (a capsule)"},
    {"unchanged", unchanged, METH_O, "whether a watch's dicts and objects are as recorded"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "torchair_state_watch", NULL, -1,
                                    methods};

PyMODINIT_FUNC PyInit_torchair_state_watch(void) { return PyModule_Create(&module); }
