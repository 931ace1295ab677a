/*
 * stonemq.protocol._recordscan: the record walk of the batch validator, in C.
 *
 * scan(buffer, start, end, count) checks that buffer[start:end] holds exactly `count` records
 * of a RecordBatch v2 (uncompressed records: the body of an uncompressed batch, or what a
 * compressed one decompresses to), each laid out as Kafka's DefaultRecord.readFrom reads it:
 *
 *   length varint | attributes int8 | timestamp delta varlong | offset delta varint |
 *   key length varint, key | value length varint, value | header count varint |
 *   per header: key length varint, key | value length varint, value
 *
 * with every length inside the record, the fields adding up to the record's length, the
 * offset delta of record i equal to i, no negative header count or header key length, no
 * length below -1, and nothing left after the last record. It returns
 * (status, record index, smallest timestamp delta, largest timestamp delta); status 0 is a
 * valid walk, any other names the first rule broken (record_batch.SCAN_ERRORS). Nothing is
 * copied and no Python object is made per record. Given a writable buffer of 2 * count
 * int64 as a fifth argument (`bounds`), it also stores where each record's bytes start and
 * end (after its length varint; the tiering decoder reads the fields of a validated run of
 * records from these with numpy). The pure-Python twin in record_batch.py
 * (scan_records_py) follows the same rules; a property test holds them to the same answers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define RELEASE_GIL_BYTES (256 * 1024)

enum {
    SCAN_OK = 0,
    SCAN_PAST_END = 1,       /* a length runs past the records */
    SCAN_VARINT = 2,         /* a varint longer than its type allows */
    SCAN_SIZE = 3,           /* fields do not add up to the record's length */
    SCAN_HEADERS = 4,        /* negative header count */
    SCAN_HEADER_KEY = 5,     /* negative header key length */
    SCAN_OFFSET_DELTA = 6,   /* offset delta is not the record's index */
    SCAN_TRAILING = 7,       /* bytes after the last record */
    SCAN_LENGTH = 8,         /* a length below -1 (or a record length below 1) */
};

/* zigzag varint of at most max_bytes bytes; returns 0 on success */
static inline int read_varint(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t end,
                              int max_bytes, int64_t *out, int *status) {
    uint64_t raw = 0;
    int shift = 0;
    for (int i = 0; i < max_bytes; i++) {
        if (*pos >= end) {
            *status = SCAN_PAST_END;
            return -1;
        }
        uint8_t b = buf[(*pos)++];
        raw |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            if (max_bytes == 5 && raw > 0xFFFFFFFFull) { /* a 32-bit varint's fifth byte */
                *status = SCAN_VARINT;
                return -1;
            }
            *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return 0;
        }
        shift += 7;
    }
    *status = SCAN_VARINT;
    return -1;
}

/* a length-prefixed field (key, value, header value); allow_null: -1 is a null */
static inline int skip_field(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t end,
                             int allow_null, int *status, int negative_status) {
    int64_t len;
    if (read_varint(buf, pos, end, 5, &len, status))
        return -1;
    if (len < 0) {
        if (len == -1 && allow_null)
            return 0;
        *status = negative_status;
        return -1;
    }
    if (len > end - *pos) {
        *status = SCAN_PAST_END;
        return -1;
    }
    *pos += (Py_ssize_t)len;
    return 0;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_buffer out = {0};
    Py_ssize_t start, end, count;
    if (!PyArg_ParseTuple(args, "y*nnn|w*", &view, &start, &end, &count, &out))
        return NULL;
    int64_t *bounds = (int64_t *)out.buf;
    if (start < 0 || end > view.len || start > end || count < 0 ||
        (bounds && out.len < count * 2 * (Py_ssize_t)sizeof(int64_t))) {
        PyBuffer_Release(&view);
        if (bounds)
            PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "scan: bounds outside the buffer");
        return NULL;
    }
    const uint8_t *buf = (const uint8_t *)view.buf;
    Py_ssize_t pos = start;
    int status = SCAN_OK;
    Py_ssize_t index = 0;
    int64_t min_ts = INT64_MAX, max_ts = INT64_MIN;

    PyThreadState *released = NULL;
    if (end - start >= RELEASE_GIL_BYTES)
        released = PyEval_SaveThread();
    for (index = 0; index < count; index++) {
        int64_t length, ts_delta, offset_delta, headers;
        if (read_varint(buf, &pos, end, 5, &length, &status))
            break;
        if (length < 1) {
            status = SCAN_LENGTH;
            break;
        }
        if (length > end - pos) {
            status = SCAN_PAST_END;
            break;
        }
        Py_ssize_t record_end = pos + (Py_ssize_t)length;
        if (bounds) {
            bounds[2 * index] = (int64_t)pos;
            bounds[2 * index + 1] = (int64_t)record_end;
        }
        pos += 1; /* attributes */
        if (read_varint(buf, &pos, record_end, 10, &ts_delta, &status))
            break;
        if (read_varint(buf, &pos, record_end, 5, &offset_delta, &status))
            break;
        if (offset_delta != index) {
            status = SCAN_OFFSET_DELTA;
            break;
        }
        if (skip_field(buf, &pos, record_end, 1, &status, SCAN_LENGTH))
            break;
        if (skip_field(buf, &pos, record_end, 1, &status, SCAN_LENGTH))
            break;
        if (read_varint(buf, &pos, record_end, 5, &headers, &status))
            break;
        if (headers < 0) {
            status = SCAN_HEADERS;
            break;
        }
        for (int64_t h = 0; h < headers && !status; h++) {
            if (skip_field(buf, &pos, record_end, 0, &status, SCAN_HEADER_KEY))
                break;
            skip_field(buf, &pos, record_end, 1, &status, SCAN_LENGTH);
        }
        if (status)
            break;
        if (pos != record_end) {
            status = SCAN_SIZE;
            break;
        }
        if (ts_delta < min_ts)
            min_ts = ts_delta;
        if (ts_delta > max_ts)
            max_ts = ts_delta;
    }
    if (!status && pos != end)
        status = SCAN_TRAILING;
    if (released)
        PyEval_RestoreThread(released);

    PyBuffer_Release(&view);
    if (bounds)
        PyBuffer_Release(&out);
    if (status)
        return Py_BuildValue("(inLL)", status, index, (long long)0, (long long)0);
    if (count == 0)
        min_ts = max_ts = 0;
    return Py_BuildValue("(inLL)", status, index, (long long)min_ts, (long long)max_ts);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Walk `count` records of buffer[start:end]: see the module."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_recordscan", "The record walk of the batch validator, in C.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__recordscan(void) {
    PyObject *m = PyModule_Create(&module);
    /* 2: scan takes the optional bounds buffer (record_batch falls back to its Python twin
     * when an older build lacks it) */
    if (m && PyModule_AddIntConstant(m, "VERSION", 2)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
