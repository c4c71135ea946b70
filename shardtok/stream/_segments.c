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

   contiguous(boundaries, rows, position_ids, document_ids, cu_seqlens) -> (n, max_seqlen)
     the same arrays for `rows` rows of seq_len = position_ids.size / rows inputs cut from one
     run of rows x (seq_len + 1) tokens (concat packing's batch), where documents begin at the
     flat token positions `boundaries` (a list of ints, ascending, inside the run) besides the
     start of the run: the segments are each row's start and every document beginning at a
     column below seq_len of its row (one beginning at the last column is a target only);
     returns how many segments there are and the longest (cu_seqlens[:n + 1] is written)
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_buffers.h"
#include "_hot_loop.h"

/* The three output arrays, or -1 with none held and an exception set. */
static int
get_outputs(PyObject *pos_obj, PyObject *doc_obj, PyObject *cu_obj, Py_buffer *pos,
            Py_buffer *doc, Py_buffer *cu)
{
    if (get_signed_buffer(pos_obj, pos, 1, 8, 0, "position_ids") < 0)
        return -1;
    if (get_signed_buffer(doc_obj, doc, 1, 4, 0, "document_ids") < 0) {
        PyBuffer_Release(pos);
        return -1;
    }
    if (get_signed_buffer(cu_obj, cu, 1, 4, 0, "cu_seqlens") < 0) {
        PyBuffer_Release(pos);
        PyBuffer_Release(doc);
        return -1;
    }
    return 0;
}

/* Segment [start, end): positions 0, 1, ... and the segment's number; returns its length. */
HOT_LOOP static Py_ssize_t
write_segment(int64_t *restrict p, int32_t *restrict d, Py_ssize_t start, Py_ssize_t end,
              int32_t id)
{
    int64_t *restrict pk = p + start;
    int32_t *restrict dk = d + start;
    for (Py_ssize_t i = 0; i < end - start; i++) {
        pk[i] = i;
        dk[i] = id;
    }
    return end - start;
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
    if (get_outputs(pos_obj, doc_obj, cu_obj, &pos, &doc, &cu) < 0)
        return NULL;
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
        Py_ssize_t start = as_index(PyList_GET_ITEM(starts, k));
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
        /* checked above: these conversions succeed */
        Py_ssize_t start = as_index(PyList_GET_ITEM(starts, k));
        Py_ssize_t end = k + 1 < n ? as_index(PyList_GET_ITEM(starts, k + 1)) : total;
        int32_t id = (int32_t)PyLong_AsLong(PyList_GET_ITEM(ids, k));
        Py_ssize_t length = write_segment(p, d, start, end, id);
        c[k] = (int32_t)start;
        if (length > longest)
            longest = length;
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

/* The segments of a batch whose rows are consecutive windows of one token run (concat
   packing): every row starts one, and so does each document beginning inside a row's inputs. */
static PyObject *
contiguous(PyObject *self, PyObject *args)
{
    PyObject *boundaries, *pos_obj, *doc_obj, *cu_obj;
    Py_ssize_t rows;
    if (!PyArg_ParseTuple(args, "O!nOOO", &PyList_Type, &boundaries, &rows, &pos_obj, &doc_obj,
                          &cu_obj))
        return NULL;
    Py_buffer pos, doc, cu;
    if (get_outputs(pos_obj, doc_obj, cu_obj, &pos, &doc, &cu) < 0)
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t *starts = NULL;
    int32_t *ids = NULL;
    Py_ssize_t total = pos.len / 8, nb = PyList_GET_SIZE(boundaries);
    Py_ssize_t seq = rows > 0 ? total / rows : 0, window = seq + 1;
    if (rows < 1 || seq < 1 || seq * rows != total || doc.len / 4 != total || cu.ndim != 1 ||
        total > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError,
                        "position_ids and document_ids must hold rows x seq_len items");
        goto done;
    }
    Py_ssize_t cap = rows + nb; /* segments at most: one per row, one per boundary */
    starts = PyMem_Malloc(sizeof(Py_ssize_t) * (cap + 1));
    ids = PyMem_Malloc(sizeof(int32_t) * cap);
    if (starts == NULL || ids == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* The segments, checked, before anything is written. */
    Py_ssize_t n = 0, row = -1, number = 0, previous = 0;
    for (Py_ssize_t k = 0; k <= nb; k++) {
        Py_ssize_t position = rows * window; /* past the last: the remaining row starts */
        if (k < nb) {
            position = as_index(PyList_GET_ITEM(boundaries, k));
            if (position == -1 && PyErr_Occurred())
                goto done;
            if (position <= previous || position >= rows * window) {
                PyErr_Format(PyExc_ValueError,
                             "boundary %zd: position %zd is not ascending inside %zd rows of %zd",
                             k, position, rows, window);
                goto done;
            }
            previous = position;
        }
        Py_ssize_t r = position / window, column = position % window;
        for (; row < r && row < rows - 1;) {
            row++;
            starts[n] = row * seq;
            ids[n++] = 0;
            number = 0;
        }
        if (k < nb && column && column < seq) { /* one at the last column is a target only */
            starts[n] = r * seq + column;
            ids[n++] = (int32_t)++number;
        }
    }
    if (cu.shape[0] < n + 1) {
        PyErr_SetString(PyExc_ValueError, "cu_seqlens must hold every segment start");
        goto done;
    }
    starts[n] = total;
    int64_t *p = (int64_t *)pos.buf;
    int32_t *d = (int32_t *)doc.buf;
    int32_t *c = (int32_t *)cu.buf;
    Py_ssize_t longest = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t length = write_segment(p, d, starts[k], starts[k + 1], ids[k]);
        c[k] = (int32_t)starts[k];
        if (length > longest)
            longest = length;
    }
    c[n] = (int32_t)total;
    result = Py_BuildValue("nn", n, longest);
done:
    PyMem_Free(starts);
    PyMem_Free(ids);
    PyBuffer_Release(&pos);
    PyBuffer_Release(&doc);
    PyBuffer_Release(&cu);
    return result;
}

static PyMethodDef methods[] = {
    {"segments", segments, METH_VARARGS,
     "segments(starts, local_ids, position_ids, document_ids, cu_seqlens) -> max_seqlen: a "
     "batch's per-segment arrays in one pass"},
    {"contiguous", contiguous, METH_VARARGS,
     "contiguous(boundaries, rows, position_ids, document_ids, cu_seqlens) -> (segments, "
     "max_seqlen): the same for rows cut from one token run at the flat boundaries"},
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
