/* A batch's input and label rows in one pass over its tokens.

   rows(grid, input_ids, labels, pad, hf, ignored) -> untrained
   The masked batch's inputs and labels from its flagged token rows: the compiled twin of
   shardtok/stream/masked_rows.py's `masked_rows_numpy`, which stays the reference and the
   fallback where no C compiler was at install time. Why it exists: a masked batch needs the
   flag cleared for the inputs, every negative target turned into -100 for the labels and the
   untrained targets counted; numpy does that in five passes over the rows and two widening
   copies (10.5 us for 8 x 2049 tokens in a hot cache against 4.1 us for the two copies a
   maskless batch needs), and in one process that difference was the main thread's whole extra
   cost of a masked batch (issue 18, target 3). Here it is the two copies' memory traffic and
   one comparison per token.
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

   contiguous(pieces, input_ids, labels, hf, masked, ignored) -> untrained, or None
   The same rows for a batch whose grid is one run of tokens cut from documents (concat
   packing, the memmap path), read straight from the documents' pieces: the run is never
   concatenated into a grid first. In one process that concatenation and the two widening
   copies after it were a fifth of the main thread's time per batch on a corpus of long
   documents (issue 18, target 1c); here every token is read once. Its twin is the grid path
   of shardtok/stream/batch.py (`np.concatenate`, then the copies or `masked_rows`).
     pieces     a list of 1-D arrays whose tokens end to end are the grid [B, W], row by row
     masked     the tokens carry the flag (int32 pieces): as `rows` without padding;
                else plain ids (uint8, uint16, int32, uint32 or int64) are widened into
                input_ids and labels as they are
     ignored    as for rows, except that a position in a row's column 0 (a document that
                starts the row: no target before it) is passed over, not refused: the
                packer's document boundaries go in as they are
     returns    None, with nothing written, where the pieces are not all C-contiguous and of
                one such dtype (the caller takes the twin), else as `rows`

   Also flag(tokens, mask, out), the masked reader's pass per decoded frame that puts the
   mask into the tokens' sign (the twin of stream/masked.py's `flag_untrained_numpy`; see it
   below).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_buffers.h"
#include "_hot_loop.h"

/* One run of grid columns [col, col + n) of a row of flagged int32 tokens (src: its tokens):
   the inputs of those columns without the flag, and the labels of the targets among them
   (column c's target is label c - 1, or c with hf, which has no label for the last column),
   -100 where flagged; returns the flagged targets. */
HOT_LOOP static Py_ssize_t
masked_chunk(const int32_t *restrict src, Py_ssize_t col, Py_ssize_t n, int64_t *restrict in_row,
             int64_t *restrict lab_row, Py_ssize_t seq, int hf)
{
    Py_ssize_t stop = col + n < seq ? col + n : seq;
    for (Py_ssize_t c = col; c < stop; c++)
        in_row[c] = src[c - col] & 0x7FFFFFFF;
    Py_ssize_t first = col < 1 ? 1 : col, last = col + n, shift = hf ? 0 : 1;
    if (hf && last > seq)
        last = seq;
    const int32_t *restrict from = src + (first - col);
    int64_t *restrict to = lab_row + (first - shift);
    uint32_t signs = 0;
    for (Py_ssize_t i = 0; i < last - first; i++) {
        int32_t t = from[i];
        signs += (uint32_t)t >> 31;
        to[i] = t < 0 ? -100 : t;
    }
    return (Py_ssize_t)signs;
}

/* A padded row's columns from `stop` on (1 <= stop < W): inputs without the flag, labels of
   those targets -100; returns how many labels that is. */
HOT_LOOP static Py_ssize_t
padding_tail(const int32_t *restrict row, Py_ssize_t stop, int64_t *restrict in_row,
             int64_t *restrict lab_row, Py_ssize_t seq, int hf)
{
    for (Py_ssize_t c = stop; c < seq; c++)
        in_row[c] = row[c] & 0x7FFFFFFF;
    Py_ssize_t first = hf ? stop : stop - 1; /* the label of column `stop`'s target */
    for (Py_ssize_t i = first; i < seq; i++)
        lab_row[i] = -100;
    return first < seq ? seq - first : 0;
}

/* -100 at the labels of the flat grid positions in the list `ignored` (see rows), adding
   those not already -100 to *untrained; -1 with an exception for a position off the grid, or
   in a row's column 0 (no target) unless `row_starts` says to pass over those. */
static int
apply_ignored(PyObject *ignored, int64_t *lab, Py_ssize_t b_rows, Py_ssize_t window, int hf,
              int row_starts, Py_ssize_t *untrained)
{
    Py_ssize_t seq = window - 1;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(ignored); k++) {
        Py_ssize_t position = as_index(PyList_GET_ITEM(ignored, k));
        if (position == -1 && PyErr_Occurred())
            return -1;
        Py_ssize_t b = position / window, column = position % window;
        if (column == 0 && row_starts && position >= 0 && b < b_rows)
            continue; /* a document starting a row: no target before it in the row */
        if (position < 0 || b >= b_rows || column == 0) {
            PyErr_Format(PyExc_ValueError, "ignored position %zd is not a target of the grid",
                         position);
            return -1;
        }
        Py_ssize_t at = hf ? column : column - 1;
        if (at >= seq)
            continue; /* hf: the last column's target has no label */
        int64_t *label = lab + b * seq + at;
        *untrained += *label != -100;
        *label = -100;
    }
    return 0;
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
        if (get_signed_buffer(pad_obj, &pad, 0, 8, 1, "pad") < 0)
            goto fail;
        if (pad.shape[0] != b_rows) {
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
        /* targets from grid column `stop` on are padding */
        Py_ssize_t stop = window;
        if (pads != NULL && pads[b] < stop)
            stop = pads[b] < 1 ? 1 : (Py_ssize_t)pads[b];
        untrained += masked_chunk(row, 0, stop, in_row, lab_row, seq, hf);
        if (stop < window)
            untrained += padding_tail(row, stop, in_row, lab_row, seq, hf);
        if (hf)
            lab_row[0] = -100;
    }
    Py_END_ALLOW_THREADS
    if (apply_ignored(ignored, lab, b_rows, window, hf, 0, &untrained) < 0)
        goto fail;
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

/* One piece's run of grid columns [col, col + n) of a row (src: its tokens): the inputs of
   those columns and the labels of the targets among them (column c's target is label c - 1,
   or c with hf, which has no label for the last column). One function per token type, so each
   loop is a plain widening copy the compiler vectorizes. */
#define PLAIN_CHUNK(NAME, T)                                                                  \
    HOT_LOOP static void NAME(const void *tokens, Py_ssize_t col, Py_ssize_t n,               \
                              int64_t *restrict in_row, int64_t *restrict lab_row,            \
                              Py_ssize_t seq, int hf)                                         \
    {                                                                                         \
        const T *restrict src = tokens;                                                       \
        Py_ssize_t stop = col + n < seq ? col + n : seq;                                      \
        for (Py_ssize_t c = col; c < stop; c++)                                               \
            in_row[c] = (int64_t)src[c - col];                                                \
        Py_ssize_t first = col < 1 ? 1 : col, last = col + n, shift = hf ? 0 : 1;             \
        if (hf && last > seq)                                                                 \
            last = seq;                                                                       \
        const T *restrict from = src + (first - col);                                         \
        int64_t *restrict to = lab_row + (first - shift);                                     \
        for (Py_ssize_t i = 0; i < last - first; i++)                                         \
            to[i] = (int64_t)from[i];                                                         \
    }

PLAIN_CHUNK(chunk_u8, uint8_t)
PLAIN_CHUNK(chunk_u16, uint16_t)
PLAIN_CHUNK(chunk_i32, int32_t)
PLAIN_CHUNK(chunk_u32, uint32_t)
PLAIN_CHUNK(chunk_i64, int64_t)

typedef void (*plain_chunk_fn)(const void *, Py_ssize_t, Py_ssize_t, int64_t *, int64_t *,
                               Py_ssize_t, int);

/* The chunk function for a piece's buffer format, or NULL (not a supported id type). */
static plain_chunk_fn
plain_chunk_for(const Py_buffer *view)
{
    const char *f = plain_format(view);
    if (f[0] == '\0' || f[1] != '\0')
        return NULL;
    switch (view->itemsize) {
    case 1:
        return f[0] == 'B' ? chunk_u8 : NULL;
    case 2:
        return f[0] == 'H' ? chunk_u16 : NULL;
    case 4:
        return f[0] == 'i' ? chunk_i32 : f[0] == 'I' ? chunk_u32 : NULL;
    case 8:
        return (f[0] == 'l' || f[0] == 'q') ? chunk_i64 : NULL;
    }
    return NULL;
}

static PyObject *
contiguous(PyObject *self, PyObject *args)
{
    PyObject *pieces, *inputs_obj, *labels_obj, *ignored;
    int hf, masked;
    if (!PyArg_ParseTuple(args, "O!OOppO!", &PyList_Type, &pieces, &inputs_obj, &labels_obj, &hf,
                          &masked, &PyList_Type, &ignored))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(pieces);
    Py_buffer inputs = {0}, labels = {0};
    Py_buffer *views = PyMem_Calloc(count ? count : 1, sizeof(Py_buffer));
    if (views == NULL)
        return PyErr_NoMemory();
    PyObject *result = NULL;
    Py_ssize_t held = 0; /* views[0:held] are acquired */
    if (get_signed_buffer(inputs_obj, &inputs, 1, 8, 2, "input_ids") < 0)
        goto done;
    if (get_signed_buffer(labels_obj, &labels, 1, 8, 2, "labels") < 0)
        goto done;
    Py_ssize_t b_rows = inputs.shape[0], seq = inputs.shape[1], window = seq + 1;
    if (labels.shape[0] != b_rows || labels.shape[1] != seq || seq < 1) {
        PyErr_SetString(PyExc_ValueError, "input_ids and labels must both be [B, S], S >= 1");
        goto done;
    }
    plain_chunk_fn plain = NULL;
    Py_ssize_t total = 0;
    for (; held < count; held++) {
        /* A piece that is not a C-contiguous buffer, or not of the first one's type: the
           caller's twin handles it (numpy's concatenation casts). */
        if (PyObject_GetBuffer(PyList_GET_ITEM(pieces, held), &views[held],
                               PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            PyErr_Clear();
            result = Py_NewRef(Py_None);
            goto done;
        }
        Py_buffer *v = &views[held];
        plain_chunk_fn fn = plain_chunk_for(v);
        int fits = v->ndim == 1 && fn != NULL && (masked ? fn == chunk_i32 : 1) &&
                   (plain == NULL || fn == plain);
        if (!fits) {
            PyBuffer_Release(v);
            result = Py_NewRef(Py_None);
            goto done;
        }
        plain = fn;
        total += v->shape[0];
    }
    if (total != b_rows * window) {
        PyErr_Format(PyExc_ValueError, "the pieces hold %zd tokens, the rows %zd", total,
                     b_rows * window);
        goto done;
    }
    int64_t *in = (int64_t *)inputs.buf;
    int64_t *lab = (int64_t *)labels.buf;
    Py_ssize_t untrained = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t at = 0; /* flat grid position of the next token */
    for (Py_ssize_t k = 0; k < count; k++) {
        const char *src = views[k].buf;
        Py_ssize_t left = views[k].shape[0], itemsize = views[k].itemsize;
        while (left > 0) {
            Py_ssize_t b = at / window, col = at % window;
            Py_ssize_t n = window - col < left ? window - col : left;
            if (masked)
                untrained += masked_chunk((const int32_t *)src, col, n, in + b * seq,
                                          lab + b * seq, seq, hf);
            else
                plain(src, col, n, in + b * seq, lab + b * seq, seq, hf);
            src += n * itemsize;
            at += n;
            left -= n;
        }
    }
    if (hf)
        for (Py_ssize_t b = 0; b < b_rows; b++)
            lab[b * seq] = -100;
    Py_END_ALLOW_THREADS
    if (apply_ignored(ignored, lab, b_rows, window, hf, 1, &untrained) < 0)
        goto done;
    result = PyLong_FromSsize_t(untrained);
done:
    for (Py_ssize_t k = 0; k < held; k++)
        PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    if (inputs.obj != NULL)
        PyBuffer_Release(&inputs);
    if (labels.obj != NULL)
        PyBuffer_Release(&labels);
    return result;
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

/* The same with out the 4-byte tokens themselves: only the flag bit is set. */
HOT_LOOP static void
flag_in_place(uint32_t *restrict o, const uint8_t *restrict m, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        o[i] |= (uint32_t)(m[i] ^ 1) << 31;
}

/* flag(tokens, mask, out): the masked reader's pass per decoded frame (stream/masked.py's
   flag_untrained and flag_frame; their numpy forms stay the twins): numpy takes three passes
   and a temporary.
     tokens  1-D C-contiguous uint8, uint16, int32 or uint32 ids below 2**31
     mask    1-D C-contiguous uint8 (0 or 1), as long
     out     1-D C-contiguous int32, as long, written; the very buffer of 4-byte tokens (in
             place: the reader's own decoded frame), or not overlapping them */
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
    const char *t_lo = tokens->buf, *t_hi = t_lo + n * tokens->itemsize;
    const char *o_lo = out->buf, *o_hi = o_lo + n * 4;
    int in_place = t_lo == o_lo && tokens->itemsize == 4;
    if (!in_place && n > 0 && t_lo < o_hi && o_lo < t_hi) {
        PyErr_SetString(PyExc_ValueError, "out must be the 4-byte tokens or not overlap them");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    if (in_place)
        flag_in_place(out->buf, mask->buf, n);
    else
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
    {"contiguous", contiguous, METH_VARARGS,
     "contiguous(pieces, input_ids, labels, hf, masked, ignored) -> untrained or None: the rows "
     "of a batch cut from one run of tokens, read from its pieces"},
    {"flag", flag, METH_VARARGS,
     "flag(tokens, mask, out): out = tokens as int32, negative where mask is 0 (one pass)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rows", "A batch's input and label rows in one pass (see the C source).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__rows(void)
{
    return PyModule_Create(&module);
}
