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
 *   watch(dicts, objects, owners) -> capsule, or None where this Python keeps no dict tags or an
 *     object's type has no valid tag: the tag of each dict (exact dicts only), the type and type
 *     tag of each object, and for each (object, dict) pair of owners that the object's __dict__
 *     is that dict. The capsule holds no references: the caller keeps every dict, object and
 *     type alive while it keeps the capsule (in a tuple the garbage collector can traverse, so a
 *     module that owns its cached call can still be freed);
 *   unchanged(watch) -> whether every dict has its tag, every object its type and type tag and
 *     every owner its dict;
 *   first_with(values, indices, name) -> the first index i of indices whose values[i] has an
 *     attribute `name` that is not None (as getattr(values[i], name, None)), else -1: a served
 *     call's check that no argument tensor carries set_dim_gears marks, in one loop;
 *   distinct(*objects) -> whether no two arguments are the same object (as
 *     len({id(o) for o in objects}) == len(objects)): Dynamo's no-aliasing guard on a call's
 *     tensors in one call, not a set of ids built by the interpreter;
 *   replace_same(values, indices, old, new) -> when values[indices[i]] is old[i] for every i,
 *     puts new[i] there and returns True; else changes nothing and returns False: a served call
 *     swaps the numbers it passes as 0-d tensors (a norm's eps, the same float object every
 *     call) for the tensors made for them last time, in one call.
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
    Py_ssize_t ndicts, nobjects, nowners;
    PyObject **dicts;        /* [ndicts], borrowed (the caller keeps them) */
    uint64_t *tags;          /* [ndicts] */
    PyObject **objects;      /* [nobjects], borrowed */
    PyTypeObject **types;    /* [nobjects], borrowed */
    unsigned int *type_tags; /* [nobjects] */
    PyObject **owners;       /* [nowners], borrowed */
    PyObject **owned;        /* [nowners]: each owner's __dict__, borrowed */
} watch_t;

static const char *WATCH = "torchair_state_watch.watch";

static void release(watch_t *w) {
    free(w->dicts);
    free(w->tags);
    free(w->objects);
    free(w->types);
    free(w->type_tags);
    free(w->owners);
    free(w->owned);
    free(w);
}

static void free_watch(PyObject *capsule) {
    watch_t *w = (watch_t *)PyCapsule_GetPointer(capsule, WATCH);
    if (w != NULL) release(w);
}

/* the object's instance dict now (NULL: none) */
static PyObject *own_dict(PyObject *obj) {
    PyObject **slot = _PyObject_GetDictPtr(obj);
    return slot != NULL ? *slot : NULL;
}

static PyObject *watch(PyObject *self, PyObject *args) {
    PyObject *dicts, *objects, *owners;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyTuple_Type, &dicts, &PyTuple_Type, &objects,
                          &PyTuple_Type, &owners))
        return NULL;
#ifdef TORCHAIR_DICT_TAGS
    Py_ssize_t nd = PyTuple_GET_SIZE(dicts), no = PyTuple_GET_SIZE(objects);
    Py_ssize_t nw = PyTuple_GET_SIZE(owners);
    for (Py_ssize_t i = 0; i < nd; i++) {
        if (!PyDict_CheckExact(PyTuple_GET_ITEM(dicts, i))) {
            PyErr_SetString(PyExc_TypeError, "watch: every dict must be a dict (not a subclass)");
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < nw; i++) {
        PyObject *pair = PyTuple_GET_ITEM(owners, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "watch: owners must be (object, dict) pairs");
            return NULL;
        }
        if (own_dict(PyTuple_GET_ITEM(pair, 0)) != PyTuple_GET_ITEM(pair, 1))
            Py_RETURN_NONE; /* not the object's __dict__: nothing to compare with */
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
    w->owners = (PyObject **)calloc(nw + 1, sizeof(PyObject *));
    w->owned = (PyObject **)calloc(nw + 1, sizeof(PyObject *));
    if (!w->dicts || !w->tags || !w->objects || !w->types || !w->type_tags || !w->owners ||
        !w->owned) {
        release(w);
        return PyErr_NoMemory();
    }
    w->ndicts = nd, w->nobjects = no, w->nowners = nw;
    for (Py_ssize_t i = 0; i < nd; i++) {
        w->dicts[i] = PyTuple_GET_ITEM(dicts, i);
        w->tags[i] = dict_tag(w->dicts[i]);
    }
    for (Py_ssize_t i = 0; i < no; i++) {
        w->objects[i] = PyTuple_GET_ITEM(objects, i);
        w->types[i] = Py_TYPE(w->objects[i]);
        w->type_tags[i] = w->types[i]->tp_version_tag;
    }
    for (Py_ssize_t i = 0; i < nw; i++) {
        w->owners[i] = PyTuple_GET_ITEM(PyTuple_GET_ITEM(owners, i), 0);
        w->owned[i] = PyTuple_GET_ITEM(PyTuple_GET_ITEM(owners, i), 1);
    }
    PyObject *capsule = PyCapsule_New(w, WATCH, free_watch);
    if (capsule == NULL) release(w);
    return capsule;
#else
    (void)dicts;
    (void)objects;
    (void)owners;
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
    for (Py_ssize_t i = 0; i < w->nowners && same; i++) same &= own_dict(w->owners[i]) == w->owned[i];
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
        PyObject *found = NULL, *value = PyList_GET_ITEM(values, i);
        Py_INCREF(value); /* a lookup may run __getattr__, which may change the list */
#if PY_VERSION_HEX >= 0x030D0000
        int rc = PyObject_GetOptionalAttr(value, name, &found);
#else
        int rc = _PyObject_LookupAttr(value, name, &found);
#endif
        Py_DECREF(value);
        if (rc < 0) return NULL;
        int marked = found != NULL && found != Py_None;
        Py_XDECREF(found);
        if (marked) return PyLong_FromSsize_t(i);
    }
    return PyLong_FromLong(-1);
}

static PyObject *distinct(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    (void)self;
    for (Py_ssize_t i = 1; i < n; i++)  /* a call's tensors: a few dozen at most */
        for (Py_ssize_t j = 0; j < i; j++)
            if (args[i] == args[j]) Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

/* values[indices[j]], with indices[j] checked against the list's length; NULL on error */
static PyObject *item_at(PyObject *values, PyObject *indices, Py_ssize_t j, Py_ssize_t *at) {
    Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(indices, j));
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0 || i >= PyList_GET_SIZE(values)) {
        PyErr_SetString(PyExc_IndexError, "replace_same: index out of range");
        return NULL;
    }
    *at = i;
    return PyList_GET_ITEM(values, i);
}

static PyObject *replace_same(PyObject *self, PyObject *args) {
    PyObject *values, *indices, *old, *new_;
    Py_ssize_t at;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!O!O!", &PyList_Type, &values, &PyTuple_Type, &indices,
                          &PyTuple_Type, &old, &PyTuple_Type, &new_))
        return NULL;
    const Py_ssize_t n = PyTuple_GET_SIZE(indices);
    if (PyTuple_GET_SIZE(old) != n || PyTuple_GET_SIZE(new_) != n) {
        PyErr_SetString(PyExc_ValueError, "replace_same: indices, old and new differ in length");
        return NULL;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *item = item_at(values, indices, j, &at);
        if (item == NULL) return NULL;
        if (item != PyTuple_GET_ITEM(old, j)) Py_RETURN_FALSE;
    }
    /* nothing above runs Python code, so the list is as checked */
    for (Py_ssize_t j = 0; j < n; j++) {
        if (item_at(values, indices, j, &at) == NULL) return NULL;
        PyObject *value = PyTuple_GET_ITEM(new_, j);
        Py_INCREF(value);
        /* steals the reference; the old item is old[j], which `old` keeps alive */
        PyList_SetItem(values, at, value);
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"replace_same", replace_same, METH_VARARGS,
     "put new[i] at values[indices[i]] when every one holds old[i]"},
    {"distinct", (PyCFunction)(void (*)(void))distinct, METH_FASTCALL,
     "whether no two arguments are the same object"},
    {"first_with", first_with, METH_VARARGS, "the first value with a non-None attribute, or -1"},
    {"watch", watch, METH_VARARGS, "the version tags of dicts and the types of objects (a capsule)"},
    {"unchanged", unchanged, METH_O, "whether a watch's dicts and objects are as recorded"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "torchair_state_watch", NULL, -1,
                                    methods};

PyMODINIT_FUNC PyInit_torchair_state_watch(void) { return PyModule_Create(&module); }
