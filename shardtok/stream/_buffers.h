/* What both kernel modules need of the arrays and lists they are given (through the buffer
   protocol, without numpy's headers). Include after Python.h. */
#ifndef SHARDTOK_BUFFERS_H
#define SHARDTOK_BUFFERS_H

/* A buffer's struct-module format without its byte-order prefix ("B" when it gives none). */
static inline const char *
plain_format(const Py_buffer *view)
{
    const char *f = view->format ? view->format : "B";
    return (*f == '<' || *f == '=' || *f == '@') ? f + 1 : f;
}

/* `obj` as a C-contiguous array of signed `itemsize`-byte integers (writable if asked), of
   `ndim` dimensions (0: any); 0, or -1 with nothing held and a TypeError naming `name`. */
static int
get_signed_buffer(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize, int ndim,
                  const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    /* numpy writes int32 as "i" and int64 as "l" or "q": only the size and signedness matter */
    const char *f = plain_format(view);
    int is_signed = (*f == 'i' || *f == 'l' || *f == 'q');
    if ((ndim && view->ndim != ndim) || view->itemsize != itemsize || !is_signed || f[1] != '\0') {
        PyErr_Format(PyExc_TypeError, "%s must be a%s C-contiguous signed %zd-byte array", name,
                     ndim == 2 ? " 2-D" : "", itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* An int, or anything with __index__ (numpy's integers): -1 with an exception set if not. */
static inline Py_ssize_t
as_index(PyObject *item)
{
    return PyLong_CheckExact(item) ? PyLong_AsSsize_t(item)
                                   : PyNumber_AsSsize_t(item, PyExc_OverflowError);
}

#endif
