/*
 * stonemq.protocol._recordscan: the record walk of the batch validator, and the columnar
 * record encoder's pass (encode, below), in C.
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


/* ---- encode: records from columns (stonemq.protocol.arrow_records' fast path) ----------- */

static inline int varint_size(uint64_t z) {
    int n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

static inline uint64_t zigzag64(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

static inline uint8_t *put_varint(uint8_t *p, uint64_t z) {
    while (z >= 0x80) {
        *p++ = (uint8_t)(z | 0x80);
        z >>= 7;
    }
    *p++ = (uint8_t)z;
    return p;
}

/* a column: its data buffer and, per row, where its bytes start and their length (-1 null) */
typedef struct {
    Py_buffer data, starts, lengths;
    int present;
} column_t;

static void release_column(column_t *c) {
    if (c->present) {
        PyBuffer_Release(&c->data);
        PyBuffer_Release(&c->starts);
        PyBuffer_Release(&c->lengths);
    }
}

static int get_column(PyObject *data, PyObject *starts, PyObject *lengths, Py_ssize_t n,
                      column_t *c, const char *name) {
    c->present = 0;
    if (data == Py_None)
        return 0;
    if (PyObject_GetBuffer(data, &c->data, PyBUF_SIMPLE))
        return -1;
    if (PyObject_GetBuffer(starts, &c->starts, PyBUF_SIMPLE)) {
        PyBuffer_Release(&c->data);
        return -1;
    }
    if (PyObject_GetBuffer(lengths, &c->lengths, PyBUF_SIMPLE)) {
        PyBuffer_Release(&c->data);
        PyBuffer_Release(&c->starts);
        return -1;
    }
    c->present = 1;
    if (c->starts.len < n * 8 || c->lengths.len < n * 8) {
        PyErr_Format(PyExc_ValueError, "encode: %s starts and lengths need %zd int64", name, n);
        return -1;
    }
    const int64_t *st = c->starts.buf, *ln = c->lengths.buf;
    for (Py_ssize_t i = 0; i < n; i++) { /* every field inside its data buffer */
        if (ln[i] < -1 || (ln[i] > 0 && (st[i] < 0 || st[i] > c->data.len - ln[i]))) {
            PyErr_Format(PyExc_ValueError, "encode: %s %zd lies outside its buffer", name, i);
            return -1;
        }
    }
    return 0;
}

/* encode(starts_out, deltas, key data, key starts, key lengths, value data, value starts,
 * value lengths, headers data, headers starts, headers lengths) -> bytes
 *
 * Record i: length varint | attributes 0 | timestamp delta 0 | offset delta deltas[i] |
 * key length, key | value length, value | its header section (count and headers, as given
 * whole), or one 0 byte (no headers) when the headers column is None. A column given as None
 * (data None) is all nulls. Every starts/lengths/deltas buffer holds int64; starts_out gets
 * n + 1 int64, where each record starts in the result and its end. */
static PyObject *encode(PyObject *self, PyObject *args) {
    PyObject *out_obj, *deltas_obj, *kd, *ks, *kl, *vd, *vs, *vl, *hd, *hs, *hl;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOO", &out_obj, &deltas_obj, &kd, &ks, &kl, &vd, &vs,
                          &vl, &hd, &hs, &hl))
        return NULL;
    Py_buffer out = {0}, deltas = {0};
    column_t keys = {0}, values = {0}, headers = {0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(deltas_obj, &deltas, PyBUF_SIMPLE))
        return NULL;
    Py_ssize_t n = deltas.len / 8;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE))
        goto done;
    if (out.len < (n + 1) * 8) {
        PyErr_SetString(PyExc_ValueError, "encode: starts_out needs n + 1 int64");
        goto done;
    }
    if (get_column(kd, ks, kl, n, &keys, "key") || get_column(vd, vs, vl, n, &values, "value") ||
        get_column(hd, hs, hl, n, &headers, "headers"))
        goto done;
    const int64_t *dl = deltas.buf;
    const int64_t *klen = keys.present ? keys.lengths.buf : NULL;
    const int64_t *vlen = values.present ? values.lengths.buf : NULL;
    const int64_t *hlen = headers.present ? headers.lengths.buf : NULL;
    int64_t *starts = out.buf;
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t k = klen ? klen[i] : -1, v = vlen ? vlen[i] : -1;
        int64_t h = hlen ? (hlen[i] > 0 ? hlen[i] : 1) : 1;
        int64_t body = 2 + varint_size(zigzag64(dl[i])) + varint_size(zigzag64(k)) +
                       (k > 0 ? k : 0) + varint_size(zigzag64(v)) + (v > 0 ? v : 0) + h;
        starts[i] = total;
        total += varint_size(zigzag64(body)) + body;
    }
    starts[n] = total;
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!result)
        goto done;
    uint8_t *base = (uint8_t *)PyBytes_AS_STRING(result), *p = base;
    const uint8_t *kdata = keys.present ? keys.data.buf : NULL;
    const uint8_t *vdata = values.present ? values.data.buf : NULL;
    const uint8_t *hdata = headers.present ? headers.data.buf : NULL;
    const int64_t *kst = keys.present ? keys.starts.buf : NULL;
    const int64_t *vst = values.present ? values.starts.buf : NULL;
    const int64_t *hst = headers.present ? headers.starts.buf : NULL;
    Py_ssize_t kcap = keys.present ? keys.data.len : 0, vcap = values.present ? values.data.len : 0;
    Py_ssize_t hcap = headers.present ? headers.data.len : 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* each input read once into a local, and checked again before anything is written:
         * the buffers are the caller's and could have changed (or overlap starts_out) since
         * the first pass */
        int64_t k = klen ? klen[i] : -1, v = vlen ? vlen[i] : -1, hl = hlen ? hlen[i] : 0;
        int64_t ks0 = k > 0 ? kst[i] : 0, vs0 = v > 0 ? vst[i] : 0, hs0 = hl > 0 ? hst[i] : 0;
        int64_t d = dl[i], at = starts[i], next = starts[i + 1];
        int64_t h = hl > 0 ? hl : 1;
        int64_t body = 2 + varint_size(zigzag64(d)) + varint_size(zigzag64(k)) +
                       (k > 0 ? k : 0) + varint_size(zigzag64(v)) + (v > 0 ? v : 0) + h;
        if (p - base != at || next - at != varint_size(zigzag64(body)) + body || next > total ||
            k < -1 || v < -1 || (k > 0 && (ks0 < 0 || ks0 > kcap - k)) ||
            (v > 0 && (vs0 < 0 || vs0 > vcap - v)) || (hl > 0 && (hs0 < 0 || hs0 > hcap - hl))) {
            bad = 1;
            break;
        }
        p = put_varint(p, zigzag64(body));
        *p++ = 0; /* attributes */
        *p++ = 0; /* timestamp delta */
        p = put_varint(p, zigzag64(d));
        p = put_varint(p, zigzag64(k));
        if (k > 0) {
            memcpy(p, kdata + ks0, (size_t)k);
            p += k;
        }
        p = put_varint(p, zigzag64(v));
        if (v > 0) {
            memcpy(p, vdata + vs0, (size_t)v);
            p += v;
        }
        if (hl > 0) {
            memcpy(p, hdata + hs0, (size_t)hl);
            p += hl;
        } else {
            *p++ = 0; /* no headers */
        }
    }
    Py_END_ALLOW_THREADS;
    if (bad) {
        Py_CLEAR(result);
        PyErr_SetString(PyExc_ValueError, "encode: the columns changed while being encoded");
    }
done:
    release_column(&keys);
    release_column(&values);
    release_column(&headers);
    if (out.obj)
        PyBuffer_Release(&out);
    PyBuffer_Release(&deltas);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Walk `count` records of buffer[start:end]: see the module."},
    {"crc32c_combine", crc32c_combine, METH_VARARGS,
     "crc32c_combine(crc(A), crc(B), len(B)) -> crc(A || B), CRC-32C."},
    {"encode", encode, METH_VARARGS, "Records from columns: see the function's comment."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_recordscan",
    "The record walk of the batch validator and the columnar record encoder, in C.", -1,
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
     * when an older build lacks it); 3: crc32c_combine; 4: encode */
    if (m && PyModule_AddIntConstant(m, "VERSION", 4)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
