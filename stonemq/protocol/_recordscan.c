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

/* CRC-32C (Castagnoli, reflected, as the crc32c package computes it) of the concatenation
 * A || B from crc(A), crc(B) and len(B), without reading either: the CRC is linear, so
 * crc(A || B) = crc(A) * x^(8 len(B)) mod P  xor  crc(B). Polynomials are bit-reflected
 * 32-bit words (x^0 in the top bit). The journal entry's CRC covers its header and the
 * batch's bytes, and the batch's own CRC (checked on produce) already covers most of them. */
#define CRC32C_POLY 0x82F63B78u

static uint32_t mult_mod_p(uint32_t a, uint32_t b) {
    uint32_t m = 1u << 31, product = 0;
    for (;;) {
        if (a & m) {
            product ^= b;
            if ((a & (m - 1)) == 0)
                break;
        }
        m >>= 1;
        b = (b & 1) ? (b >> 1) ^ CRC32C_POLY : b >> 1;
    }
    return product;
}

static uint32_t x_pow_2n[32]; /* x^(2^n) mod P */

/* the last powers asked for, by length: a producer's batches often have the same size */
#define POWER_CACHE 64
static uint64_t cached_bytes[POWER_CACHE];
static uint32_t cached_power[POWER_CACHE]; /* 0 (never a power of x mod P): empty */

static uint32_t x_pow_8n(uint64_t bytes) { /* x^(8 bytes) mod P */
    unsigned slot = (unsigned)(bytes % POWER_CACHE);
    if (cached_power[slot] && cached_bytes[slot] == bytes)
        return cached_power[slot];
    uint64_t n = bytes;
    uint32_t p = 1u << 31; /* x^0 */
    int k = 3;             /* 8 = 2^3 */
    while (n) {
        if (n & 1)
            p = mult_mod_p(x_pow_2n[k & 31], p);
        n >>= 1;
        k++;
    }
    cached_bytes[slot] = bytes;
    cached_power[slot] = p;
    return p;
}

static PyObject *crc32c_combine(PyObject *self, PyObject *args) {
    unsigned long crc_a, crc_b;
    long long len_b;
    if (!PyArg_ParseTuple(args, "kkL", &crc_a, &crc_b, &len_b))
        return NULL;
    if (len_b < 0 || crc_a > 0xFFFFFFFFul || crc_b > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_ValueError, "crc32c_combine: CRCs are 32-bit, lengths >= 0");
        return NULL;
    }
    uint32_t crc = mult_mod_p(x_pow_8n((uint64_t)len_b), (uint32_t)crc_a) ^ (uint32_t)crc_b;
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Walk `count` records of buffer[start:end]: see the module."},
    {"crc32c_combine", crc32c_combine, METH_VARARGS,
     "crc32c_combine(crc(A), crc(B), len(B)) -> crc(A || B), CRC-32C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_recordscan", "The record walk of the batch validator, in C.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__recordscan(void) {
    uint32_t p = 1u << 30; /* x^1 */
    for (int n = 0; n < 32; n++) {
        x_pow_2n[n] = p;
        p = mult_mod_p(p, p);
    }
    PyObject *m = PyModule_Create(&module);
    /* 2: scan takes the optional bounds buffer (record_batch falls back to its Python twin
     * when an older build lacks it); 3: crc32c_combine */
    if (m && PyModule_AddIntConstant(m, "VERSION", 3)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
