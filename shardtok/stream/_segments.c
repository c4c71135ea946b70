/* A batch's per-segment arrays (position_ids, document_ids, cu_seqlens) in one pass.

   The compiled twin of shardtok/stream/segments.py's `fill_segments_numpy`, which stays the
   reference and the fallback where no C compiler was at install time. Why it exists: numpy
   builds the positions as `arange - starts.repeat(lengths)` and the document numbers as
   `ids.repeat(lengths)`, two temporaries of a token each plus the copies out of them; in one
   process that was a tenth of the main thread's time per batch (issue 18: perf had
   PyArray_Repeat, LONG_subtract and their memmoves at 12% of it) for what is a write of each
   output once.

   segments(starts, local_ids, position_ids, document_ids, cu_seqlens) -> max_seqlen
     starts        list of ints: flat start of every segment, non-decreasing, the first 0
     local_ids     list of ints (as many): each segment's number within its row
     position_ids  int64, C-contiguous, any shape, written: flat i -> i - its segment's start
     document_ids  int32, C-contiguous, as many items, written: flat i -> its segment's number
     cu_seqlens    int32 1-D, C-contiguous, at least len(starts) + 1 items; its first
                   len(starts) + 1 are written: the starts, then the total
     returns       the longest segment
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static int
get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        return -1;
    /* numpy writes int32 as "i" and int64 as "l" or "q": only the size and signedness matter */
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    int is_signed = (*f == 'i' || *f == 'l' || *f == 'q');
    if (view->itemsize != itemsize || !is_signed || f[1] != '\0') {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous signed %zd-byte array", name,
                     itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *
segments(PyObject *self, PyObject *args)
{
    PyObject *starts, *ids, *pos_obj, *doc_obj, *cu_obj;
    if (!PyArg_ParseTuple(args, "O!O!OOO", &PyList_Type, &starts, &PyList_Type, &ids, &pos_obj,
                          &doc_obj, &cu_obj))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(starts);
    if (n < 1 || PyList_GET_SIZE(ids) != n) {
        PyErr_SetString(PyExc_ValueError, "starts and local_ids must be equally long, not empty");
        return NULL;
    }
    Py_buffer pos, doc, cu;
    if (get_buffer(pos_obj, &pos, 8, "position_ids") < 0)
        return NULL;
    if (get_buffer(doc_obj, &doc, 4, "document_ids") < 0) {
        PyBuffer_Release(&pos);
        return NULL;
    }
    if (get_buffer(cu_obj, &cu, 4, "cu_seqlens") < 0) {
        PyBuffer_Release(&pos);
        PyBuffer_Release(&doc);
        return NULL;
    }
    Py_ssize_t total = pos.len / 8;
    int64_t *p = (int64_t *)pos.buf;
    int32_t *d = (int32_t *)doc.buf;
    int32_t *c = (int32_t *)cu.buf;
    Py_ssize_t longest = 0;
    if (doc.len / 4 != total || cu.ndim != 1 || cu.shape[0] < n + 1 || total > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError,
                        "document_ids must match position_ids and cu_seqlens hold every start");
        goto fail;
    }
    /* Everything is checked before anything is written: a bad list leaves the arrays as
       they were. */
    Py_ssize_t previous = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t start = PyLong_AsSsize_t(PyList_GET_ITEM(starts, k));
        long id = PyLong_AsLong(PyList_GET_ITEM(ids, k));
        if ((start == -1 || id == -1) && PyErr_Occurred())
            goto fail;
        if ((k == 0 && start != 0) || start < previous || start > total || id < INT32_MIN ||
            id > INT32_MAX) {
            PyErr_Format(PyExc_ValueError,
                         "segment %zd: start %zd and number %ld do not fit %zd ascending tokens",
                         k, start, id, total);
            goto fail;
        }
        previous = start;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t start = PyLong_AsSsize_t(PyList_GET_ITEM(starts, k));
        Py_ssize_t end = k + 1 < n ? PyLong_AsSsize_t(PyList_GET_ITEM(starts, k + 1)) : total;
        int32_t id = (int32_t)PyLong_AsLong(PyList_GET_ITEM(ids, k));
        c[k] = (int32_t)start;
        if (end - start > longest)
            longest = end - start;
        int64_t *restrict pk = p + start;
        int32_t *restrict dk = d + start;
        for (Py_ssize_t i = 0; i < end - start; i++) {
            pk[i] = i;
            dk[i] = id;
        }
    }
    c[n] = (int32_t)total;
    PyBuffer_Release(&pos);
    PyBuffer_Release(&doc);
    PyBuffer_Release(&cu);
    return PyLong_FromSsize_t(longest);
fail:
    PyBuffer_Release(&pos);
    PyBuffer_Release(&doc);
    PyBuffer_Release(&cu);
    return NULL;
}

static PyMethodDef methods[] = {
    {"segments", segments, METH_VARARGS,
     "segments(starts, local_ids, position_ids, document_ids, cu_seqlens) -> max_seqlen: a "
     "batch's per-segment arrays in one pass"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_segments", "A batch's per-segment arrays in one pass (see the C source).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__segments(void)
{
    return PyModule_Create(&module);
}
