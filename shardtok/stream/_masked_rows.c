/* The masked batch's inputs and labels in one pass over its flagged token rows.

   The compiled twin of shardtok/stream/masked_rows.py's `masked_rows_numpy`, which
   stays the reference and the fallback where no C compiler was at install time. Why it
   exists: a masked batch needs the flag cleared for the inputs, every negative target turned
   into -100 for the labels and the untrained targets counted; numpy does that in five passes
   over the rows and two widening copies (10.5 us for 8 x 2049 tokens in a hot cache against
   4.1 us for the two copies a maskless batch needs), and in one process that difference was
   the main thread's whole extra cost of a masked batch (issue 18, target 3). Here it is the
   two copies' memory traffic and one comparison per token.

   Also flag(tokens, mask, out), the masked reader's pass per decoded frame that puts the
   mask into the tokens' sign (the twin of stream/masked.py's `flag_untrained_numpy`; see it
   below).

   rows(grid, input_ids, labels, pad, hf, ignored) -> untrained
     grid       int32 [B, W], C-contiguous: tokens, negative where the loss mask is 0
     input_ids  int64 [B, W - 1], C-contiguous, written: grid[:, :-1] & 0x7FFFFFFF
     labels     int64 [B, W - 1], C-contiguous, written: the target of input i (grid[:, i + 1])
                at i, or with hf at i + 1 (column 0 -100, the last target dropped); -100 where
                the target is negative or its grid column is at or past the row's pad
     pad        None, or int64 [B]: per row, the grid column where padding targets begin
     hf         whether labels take the Hugging Face layout
     ignored    a list of distinct flat grid positions (column >= 1) whose target is -100
                (a document's first token); hf has no label for a row's last column
     returns    how many targets were written as -100 (hf's column 0 is no target)
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_buffers.h"
#include "_hot_loop.h"

/* One row: inputs without the flag, labels [first, end) from the tokens `offset` columns on
   (-100 where flagged), -100 from `end` on; returns the flagged targets plus the padded ones. */
HOT_LOOP static Py_ssize_t
row_pass(const int32_t *restrict row, int64_t *restrict in_row, int64_t *restrict lab_row,
         Py_ssize_t seq, Py_ssize_t first, Py_ssize_t end, Py_ssize_t offset)
{
    for (Py_ssize_t i = 0; i < seq; i++)
        in_row[i] = row[i] & 0x7FFFFFFF;
    const int32_t *restrict source = row + offset;
    uint32_t signs = 0;
    for (Py_ssize_t i = first; i < end; i++) {
        int32_t t = source[i];
        signs += (uint32_t)t >> 31;
        lab_row[i] = t < 0 ? -100 : t;
    }
    for (Py_ssize_t i = end; i < seq; i++)
        lab_row[i] = -100;
    return (Py_ssize_t)signs + (seq - end);
}

static PyObject *
rows(PyObject *self, PyObject *args)
{
    PyObject *grid_obj, *inputs_obj, *labels_obj, *pad_obj, *ignored;
    int hf;
    if (!PyArg_ParseTuple(args, "OOOOpO!", &grid_obj, &inputs_obj, &labels_obj, &pad_obj, &hf,
                          &PyList_Type, &ignored))
        return NULL;
    Py_buffer grid, inputs, labels, pad = {0};
    if (get_signed_buffer(grid_obj, &grid, 0, 4, 2, "grid") < 0)
        return NULL;
    if (get_signed_buffer(inputs_obj, &inputs, 1, 8, 2, "input_ids") < 0) {
        PyBuffer_Release(&grid);
        return NULL;
    }
    if (get_signed_buffer(labels_obj, &labels, 1, 8, 2, "labels") < 0) {
        PyBuffer_Release(&grid);
        PyBuffer_Release(&inputs);
        return NULL;
    }
    Py_ssize_t b_rows = grid.shape[0], window = grid.shape[1];
    if (window < 2 || inputs.shape[0] != b_rows || labels.shape[0] != b_rows ||
        inputs.shape[1] != window - 1 || labels.shape[1] != window - 1) {
        PyErr_SetString(PyExc_ValueError, "input_ids and labels must be [B, W - 1] for grid [B, W]");
        PyBuffer_Release(&grid);
        PyBuffer_Release(&inputs);
        PyBuffer_Release(&labels);
        return NULL;
    }
    const int64_t *pads = NULL;
    if (pad_obj != Py_None) {
        if (PyObject_GetBuffer(pad_obj, &pad, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto fail;
        const char *f = plain_format(&pad);
        if (pad.ndim != 1 || pad.itemsize != 8 || pad.shape[0] != b_rows ||
            (*f != 'l' && *f != 'q') || f[1] != '\0') {
            PyErr_SetString(PyExc_TypeError, "pad must be None or a C-contiguous int64 [B]");
            goto fail;
        }
        pads = (const int64_t *)pad.buf;
    }
    const int32_t *g = (const int32_t *)grid.buf;
    int64_t *in = (int64_t *)inputs.buf;
    int64_t *lab = (int64_t *)labels.buf;
    Py_ssize_t seq = window - 1, untrained = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < b_rows; b++) {
        const int32_t *restrict row = g + b * window;
        int64_t *restrict in_row = in + b * seq;
        int64_t *restrict lab_row = lab + b * seq;
        /* label i holds grid column i + 1 (shifted) or i (hf, from label 1 on); targets from
           grid column `stop` on are padding */
        Py_ssize_t first = hf ? 1 : 0, offset = hf ? 0 : 1;
        Py_ssize_t stop = window;
        if (pads != NULL && pads[b] < stop)
            stop = pads[b] < 1 ? 1 : (Py_ssize_t)pads[b];
        Py_ssize_t end = stop - offset; /* labels [first, end) are real targets */
        if (end > seq)
            end = seq;
        if (end < first)
            end = first;
        untrained += row_pass(row, in_row, lab_row, seq, first, end, offset);
        if (hf)
            lab_row[0] = -100;
    }
    Py_END_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(ignored); k++) {
        Py_ssize_t position = PyLong_AsSsize_t(PyList_GET_ITEM(ignored, k));
        if (position == -1 && PyErr_Occurred())
            goto fail;
        Py_ssize_t b = position / window, column = position % window;
        if (position < 0 || b >= b_rows || column == 0) {
            PyErr_Format(PyExc_ValueError, "ignored position %zd is not a target of the grid",
                         position);
            goto fail;
        }
        Py_ssize_t at = hf ? column : column - 1;
        if (at >= seq)
            continue; /* hf: the last column's target has no label */
        int64_t *label = lab + b * seq + at;
        untrained += *label != -100;
        *label = -100;
    }
    PyBuffer_Release(&grid);
    PyBuffer_Release(&inputs);
    PyBuffer_Release(&labels);
    if (pads != NULL)
        PyBuffer_Release(&pad);
    return PyLong_FromSsize_t(untrained);
fail:
    PyBuffer_Release(&grid);
    PyBuffer_Release(&inputs);
    PyBuffer_Release(&labels);
    if (pad.obj != NULL)
        PyBuffer_Release(&pad);
    return NULL;
}

/* out[i] = tokens[i] with the sign bit set where mask[i] is 0; `itemsize` 1 (uint8),
   2 (uint16) or 4 ((u)int32 below 2**31). */
HOT_LOOP static void
flag_pass(const void *tokens, int itemsize, const uint8_t *restrict m, uint32_t *restrict o,
          Py_ssize_t n)
{
    if (itemsize == 1) {
        const uint8_t *restrict t = tokens;
        for (Py_ssize_t i = 0; i < n; i++)
            o[i] = (uint32_t)t[i] | ((uint32_t)(m[i] ^ 1) << 31);
    } else if (itemsize == 2) {
        const uint16_t *restrict t = tokens;
        for (Py_ssize_t i = 0; i < n; i++)
            o[i] = (uint32_t)t[i] | ((uint32_t)(m[i] ^ 1) << 31);
    } else {
        const uint32_t *restrict t = tokens;
        for (Py_ssize_t i = 0; i < n; i++)
            o[i] = t[i] | ((uint32_t)(m[i] ^ 1) << 31);
    }
}

/* flag(tokens, mask, out): the masked reader's pass per decoded frame (stream/masked.py's
   flag_untrained; its numpy form stays the twin): numpy takes three passes and a temporary.
     tokens  1-D C-contiguous uint8, uint16, int32 or uint32 ids below 2**31
     mask    1-D C-contiguous uint8 (0 or 1), as long
     out     1-D C-contiguous int32, as long, written */
static PyObject *
flag(PyObject *self, PyObject *args)
{
    PyObject *tokens_obj, *mask_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OOO", &tokens_obj, &mask_obj, &out_obj))
        return NULL;
    Py_buffer views[3] = {{0}, {0}, {0}};
    PyObject *objects[3] = {tokens_obj, mask_obj, out_obj};
    PyObject *result = NULL;
    for (int k = 0; k < 3; k++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (k == 2 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(objects[k], &views[k], flags) < 0)
            goto done;
    }
    const char *formats[3];
    for (int k = 0; k < 3; k++)
        formats[k] = plain_format(&views[k]);
    Py_buffer *tokens = &views[0], *mask = &views[1], *out = &views[2];
    char t = formats[0][0];
    int token_ok = formats[0][1] == '\0' && ((tokens->itemsize == 1 && t == 'B') ||
                   (tokens->itemsize == 2 && t == 'H') ||
                   (tokens->itemsize == 4 && (t == 'i' || t == 'I')));
    if (!token_ok || tokens->ndim != 1 || mask->ndim != 1 || out->ndim != 1 ||
        mask->itemsize != 1 || formats[1][0] != 'B' || formats[1][1] != '\0' ||
        out->itemsize != 4 || formats[2][0] != 'i' || formats[2][1] != '\0') {
        PyErr_SetString(PyExc_TypeError, "flag takes 1-D uint8/uint16/int32/uint32 tokens, a "
                                         "uint8 mask and an int32 out");
        goto done;
    }
    Py_ssize_t n = out->shape[0];
    if (tokens->shape[0] != n || mask->shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "tokens, mask and out must be as long");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    flag_pass(tokens->buf, (int)tokens->itemsize, mask->buf, out->buf, n);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    for (int k = 0; k < 3; k++)
        if (views[k].obj != NULL)
            PyBuffer_Release(&views[k]);
    return result;
}

static PyMethodDef methods[] = {
    {"rows", rows, METH_VARARGS,
     "rows(grid, input_ids, labels, pad, hf, ignored) -> untrained: a masked batch's inputs and labels "
     "in one pass"},
    {"flag", flag, METH_VARARGS,
     "flag(tokens, mask, out): out = tokens as int32, negative where mask is 0 (one pass)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_masked_rows", "The masked batch's rows in one pass (see the C source).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__masked_rows(void)
{
    return PyModule_Create(&module);
}
