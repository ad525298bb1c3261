/*
 * profkit._fold: the compiled core of profkit.parse.perf_script (at the package top, so
 * that importing it costs nothing more: see profkit/stackcollapse.py).
 *
 * Folds `perf script` text exactly as stackcollapse-perf.pl does (and as the pure-Python
 * reference _PyFolder in perf_script.py does: keep the two in step, the tests compare
 * them byte for byte). Input arrives in chunks (feed), lines are split here, and no
 * Python object is made per line: one bytes object per sample (its folded stack), a few
 * per header. Perl's patterns are emulated with linear scans; see the Python reference
 * for the reasoning behind each one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *FoldError;

#define UV_MAX_U64 UINT64_MAX

static inline int is_ws(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == 0x0b || c == 0x0c || c == '\r';
}
static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static inline int is_word(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_';
}
static inline int is_hex(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
static inline int is_lowhex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f'); }

/* ------------------------------------------------------------------ growable buffers */

typedef struct { char *p; Py_ssize_t len, cap; } buf_t;

static int buf_reserve(buf_t *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    char *p = PyMem_Realloc(b->p, cap);
    if (!p) { PyErr_NoMemory(); return -1; }
    b->p = p; b->cap = cap;
    return 0;
}
static int buf_add(buf_t *b, const char *s, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0) return -1;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

typedef struct { Py_ssize_t off, len; } span_t;
typedef struct { span_t *p; Py_ssize_t len, cap; } spans_t;

static int spans_add(spans_t *v, Py_ssize_t off, Py_ssize_t len) {
    if (v->len == v->cap) {
        Py_ssize_t cap = v->cap ? v->cap * 2 : 64;
        span_t *p = PyMem_Realloc(v->p, cap * sizeof(span_t));
        if (!p) { PyErr_NoMemory(); return -1; }
        v->p = p; v->cap = cap;
    }
    v->p[v->len].off = off; v->p[v->len].len = len; v->len++;
    return 0;
}

/* ------------------------------------------------------------------ the folder */

typedef struct {
    PyObject_HEAD
    /* options */
    int o_pid, o_tid, o_kernel, o_jit, o_addrs, o_samples, o_vdso_names, o_strict;
    PyObject *vdso_lookup;
    Py_ssize_t max_line;
    buf_t event_filter;
    int have_filter, defaulted;
    PyObject *filter_warning;
    /* results */
    PyObject *collapsed, *modules, *events;
    uint64_t *seen; Py_ssize_t seen_cap, seen_len;   /* hashes of names put in modules */
    /* state */
    buf_t carry, pname, names, key, last_event;
    int have_pname;
    spans_t entries, groups;       /* groups: (first entry, count) per frame line */
    uint64_t period_u; double period_d; int period_nv;
    long long samples, skipped, unrecognized, lineno, nbytes;
    long long first_unrec_line; PyObject *first_unrec_text;
    int in_sample, last_newline;
    long long sample_line;
    int finished, partial;
    /* frame-line cache: a line seen before (same java flag) gives the same names */
    struct centry { uint64_t h; Py_ssize_t line_off, line_len, id; } *cache;
    Py_ssize_t cache_cap, cache_len;
    buf_t cache_bytes;
    /* per cached line, by id: its names in cache_bytes ([length][bytes] each); -1: skipped */
    struct lmeta { Py_ssize_t names_off; Py_ssize_t nnames; } *lm;
    Py_ssize_t lm_len, lm_cap;
    /* the current sample, leaf first: ids of cached lines (>= 0), -(group + 1) otherwise */
    Py_ssize_t *items; Py_ssize_t items_len, items_cap;
    int sample_slow;
    /* samples made of cached lines only: (pname, ids) -> weight, folded into `collapsed`
     * (as byte strings) at the end or when the table grows large */
    struct sentry { uint64_t h; Py_ssize_t off; uint64_t u; double d; int nv; } *st;
    Py_ssize_t st_cap, st_len;
    buf_t st_bytes;
    Py_ssize_t cache_max, table_max;   /* bytes; past them: no caching / a flush */
} Folder;

static void Folder_dealloc(Folder *f) {
    Py_XDECREF(f->vdso_lookup); Py_XDECREF(f->filter_warning);
    Py_XDECREF(f->collapsed); Py_XDECREF(f->modules); Py_XDECREF(f->events);
    Py_XDECREF(f->first_unrec_text);
    PyMem_Free(f->seen);
    PyMem_Free(f->carry.p); PyMem_Free(f->pname.p); PyMem_Free(f->names.p);
    PyMem_Free(f->key.p); PyMem_Free(f->last_event.p); PyMem_Free(f->event_filter.p);
    PyMem_Free(f->entries.p); PyMem_Free(f->groups.p);
    PyMem_Free(f->cache); PyMem_Free(f->cache_bytes.p);
    PyMem_Free(f->lm); PyMem_Free(f->items); PyMem_Free(f->st); PyMem_Free(f->st_bytes.p);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static int Folder_init(Folder *f, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"pid", "tid", "kernel", "jit", "addrs", "event_filter", "samples",
                             "vdso_names", "vdso_lookup", "strict", "max_line", "cache_max",
                             "table_max", NULL};
    Py_buffer ef = {0};
    PyObject *lookup = Py_None;
    f->max_line = 1 << 20;
    f->cache_max = 64 << 20;
    f->table_max = 128 << 20;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|pppppy*ppOpnnn", kwlist, &f->o_pid, &f->o_tid,
                                     &f->o_kernel, &f->o_jit, &f->o_addrs, &ef, &f->o_samples,
                                     &f->o_vdso_names, &lookup, &f->o_strict, &f->max_line,
                                     &f->cache_max, &f->table_max))
        return -1;
    if (ef.buf) {
        if (ef.len && buf_add(&f->event_filter, ef.buf, ef.len) < 0) { PyBuffer_Release(&ef); return -1; }
        f->have_filter = ef.len > 0;
        PyBuffer_Release(&ef);
    }
    if (lookup != Py_None) { Py_INCREF(lookup); f->vdso_lookup = lookup; }
    f->collapsed = PyDict_New(); f->modules = PyDict_New(); f->events = PyDict_New();
    if (!f->collapsed || !f->modules || !f->events) return -1;
    f->last_newline = 1;
    f->period_u = 1;
    return 0;
}

static PyObject *fold_error(const char *kind, long long lineno, const char *text, Py_ssize_t n) {
    if (n > 120) n = 120;
    PyObject *t = PyBytes_FromStringAndSize(text, n);
    if (!t) return NULL;
    PyObject *a = Py_BuildValue("(sLN)", kind, lineno, t);
    if (a) { PyErr_SetObject(FoldError, a); Py_DECREF(a); }
    return NULL;
}

/* ---- Perl patterns (see perf_script.py for the reasoning) */

/* Perl: ^(\S.+?)\s+(\d+)\/ *(\d+)*\s+  (without the space before the star) */
static int header(const unsigned char *s, Py_ssize_t n, Py_ssize_t *comm_end,
                  Py_ssize_t *pid_a, Py_ssize_t *pid_b, Py_ssize_t *tid_a, Py_ssize_t *tid_b) {
    if (n < 2 || is_ws(s[0])) return 0;
    Py_ssize_t k = is_ws(s[1]) ? 1 : 2;
    while (k < n) {
        if (!is_ws(s[k])) { k++; continue; }
        Py_ssize_t start = k;
        while (k < n && is_ws(s[k])) k++;
        if (start < 2) { start = 2; if (start >= k) continue; }
        Py_ssize_t p = k;
        while (p < n && is_digit(s[p])) p++;
        if (p == k) continue;
        Py_ssize_t q = p;
        while (q < n && s[q] == '/') q++;
        Py_ssize_t r = q;
        while (r < n && is_digit(s[r])) r++;
        if (r < n && is_ws(s[r])) {
            *comm_end = start; *pid_a = k; *pid_b = p;
            if (r > q) { *tid_a = q; *tid_b = r; } else { *tid_a = *tid_b = -1; }
            return 1;
        }
        k = p;
    }
    return 0;
}

/* /:\s*(\d+)*\s+(\S+):\s*$/ ; returns 1 with period span (da==-1: none), event span */
static int event(const unsigned char *s, Py_ssize_t n, Py_ssize_t *da, Py_ssize_t *db,
                 Py_ssize_t *ea, Py_ssize_t *eb) {
    Py_ssize_t end = n;
    while (end > 0 && is_ws(s[end - 1])) end--;
    if (end < 2 || s[end - 1] != ':') return 0;
    Py_ssize_t t = end - 1;
    while (t > 0 && !is_ws(s[t - 1])) t--;
    if (t == 0 || end - 1 - t < 1) return 0;
    Py_ssize_t w1 = t;
    while (w1 > 0 && is_ws(s[w1 - 1])) w1--;
    Py_ssize_t d = w1;
    while (d > 0 && is_digit(s[d - 1])) d--;
    Py_ssize_t w0 = d;
    while (w0 > 0 && is_ws(s[w0 - 1])) w0--;
    *ea = t; *eb = end - 1;
    if (d < w1) {
        if (w0 == 0 || s[w0 - 1] != ':') return 0;
        *da = d; *db = w1;
        return 1;
    }
    if (w1 == 0 || s[w1 - 1] != ':') return 0;
    *da = *db = -1;
    return 1;
}

static Py_ssize_t rfind2(const unsigned char *s, Py_ssize_t end, char a, char b) {
    /* last i with i+2 <= end and s[i]==a, s[i+1]==b */
    for (Py_ssize_t i = end - 2; i >= 0; i--)
        if (s[i] == (unsigned char)a && s[i + 1] == (unsigned char)b) return i;
    return -1;
}

/* /^\s*(\w+)\s*(.+) \((.*)\)/ */
static int frame_parts(const unsigned char *s, Py_ssize_t n, Py_ssize_t *pc_a, Py_ssize_t *pc_b,
                       Py_ssize_t *f_a, Py_ssize_t *f_b, Py_ssize_t *m_a, Py_ssize_t *m_b,
                       Py_ssize_t *j_out, Py_ssize_t *close_out) {
    Py_ssize_t i0 = 0;
    while (i0 < n && is_ws(s[i0])) i0++;
    Py_ssize_t j = i0;
    while (j < n && is_word(s[j])) j++;
    if (j == i0) return 0;
    Py_ssize_t k = j;
    while (k < n && is_ws(s[k])) k++;
    Py_ssize_t close = -1;
    for (Py_ssize_t i = n - 1; i >= 0; i--) if (s[i] == ')') { close = i; break; }
    if (close < 0) return 0;
    Py_ssize_t e = rfind2(s, close, ' ', '(');
    if (e < 0) return 0;
    Py_ssize_t t = k < e - 1 ? k : e - 1;
    if (t < i0 + 1) return 0;
    *pc_a = i0; *pc_b = t < j ? t : j;
    *f_a = t; *f_b = e;
    *m_a = e + 2; *m_b = close;
    *j_out = j; *close_out = close;
    return 1;
}

static int mem_has(const unsigned char *s, Py_ssize_t n, const char *needle) {
    Py_ssize_t m = (Py_ssize_t)strlen(needle);
    if (m > n) return 0;
    return memmem(s, n, needle, m) != NULL;
}

static int is_jit_map(const unsigned char *m, Py_ssize_t n) {
    for (Py_ssize_t p = 0; p + 10 <= n; p++) {
        if (memcmp(m + p, "/tmp/perf-", 10)) continue;
        Py_ssize_t q = p + 10, r = q;
        while (r < n && is_digit(m[r])) r++;
        if (r > q && r + 4 <= n && !memcmp(m + r, ".map", 4)) return 1;
    }
    return 0;
}

static int is_go_method(const unsigned char *f, Py_ssize_t n) {
    Py_ssize_t a = -1;
    for (Py_ssize_t i = 0; i + 1 < n; i++) if (f[i] == '.' && f[i + 1] == '(') { a = i; break; }
    if (a < 0) return 0;
    for (Py_ssize_t i = n - 2; i >= a + 2; i--) if (f[i] == ')' && f[i + 1] == '.') return 1;
    return 0;
}

/* Append one frame name (func, already split on "->") to f->names, tidied as Perl does;
 * first: whether it is the first of its line's chain. */
static int emit_name(Folder *f, const unsigned char *func, Py_ssize_t fn,
                     const unsigned char *pc, Py_ssize_t pcn, const unsigned char *mod,
                     Py_ssize_t mn, int java, int first) {
    buf_t *b = &f->names;
    Py_ssize_t start = b->len;
    /* raw name into the buffer first */
    if (fn == 9 && !memcmp(func, "[unknown]", 9)) {
        int vdso_mod = (mn == 6 && !memcmp(mod, "[vdso]", 6));
        if (vdso_mod && f->vdso_lookup) {
            PyObject *a = PyBytes_FromStringAndSize((const char *)pc, pcn);
            if (!a) return -1;
            PyObject *r = PyObject_CallOneArg(f->vdso_lookup, a);
            Py_DECREF(a);
            if (!r) return -1;
            if (PyBytes_Check(r)) {
                if (buf_add(b, PyBytes_AS_STRING(r), PyBytes_GET_SIZE(r)) < 0) { Py_DECREF(r); return -1; }
            } else if (buf_add(b, "[vdso]", 6) < 0) { Py_DECREF(r); return -1; }
            Py_DECREF(r);
        } else if (vdso_mod && f->o_vdso_names) {
            if (buf_add(b, "[vdso]", 6) < 0) return -1;
        } else {
            const unsigned char *nm; Py_ssize_t nn;
            if (!(mn == 9 && !memcmp(mod, "[unknown]", 9))) {
                Py_ssize_t sl = -1;
                for (Py_ssize_t i = mn - 1; i >= 0; i--) if (mod[i] == '/') { sl = i; break; }
                nm = mod + sl + 1; nn = mn - sl - 1;
            } else { nm = (const unsigned char *)"unknown"; nn = 7; }
            if (buf_add(b, "[", 1) < 0 || buf_add(b, (const char *)nm, nn) < 0) return -1;
            if (f->o_addrs) {
                if (buf_add(b, " <", 2) < 0 || buf_add(b, (const char *)pc, pcn) < 0 ||
                    buf_add(b, ">", 1) < 0) return -1;
            }
            if (buf_add(b, "]", 1) < 0) return -1;
        }
    } else if (buf_add(b, (const char *)func, fn) < 0) return -1;
    unsigned char *s = (unsigned char *)b->p + start;
    Py_ssize_t n = b->len - start;
    /* ; -> : */
    for (Py_ssize_t i = 0; i < n; i++) if (s[i] == ';') s[i] = ':';
    /* cut at the first '(' not opening "(anonymous namespace)", unless a Go method */
    if (!is_go_method(s, n)) {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (s[i] != '(') continue;
            if (n - (i + 1) >= 20 && !memcmp(s + i + 1, "anonymous namespace)", 20)) continue;
            n = i;
            break;
        }
    }
    /* drop quotes */
    Py_ssize_t w = 0;
    for (Py_ssize_t i = 0; i < n; i++) if (s[i] != '"' && s[i] != '\'') s[w++] = s[i];
    n = w;
    /* Java: leading L of a class path */
    if (java && n && s[0] == 'L' && memchr(s, '/', n)) { memmove(s, s + 1, n - 1); n--; }
    b->len = start + n;
    if (!first) {
        if (!mem_has(s, n, "_[i]") && buf_add(b, "_[i]", 4) < 0) return -1;
    } else if (f->o_kernel && mn && (mod[0] == '[' || (mn >= 7 && !memcmp(mod + mn - 7, "vmlinux", 7)))
               && !mem_has(mod, mn, "unknown")) {
        if (buf_add(b, "_[k]", 4) < 0) return -1;
    } else if (f->o_jit && is_jit_map(mod, mn)) {
        s = (unsigned char *)b->p + start;
        if (!mem_has(s, n, "_[j]") && buf_add(b, "_[j]", 4) < 0) return -1;
    }
    if (spans_add(&f->entries, start, b->len - start) < 0) return -1;
    /* modules: name -> first module, one dict insert per new name */
    {
        const unsigned char *nm = (const unsigned char *)b->p + start;
        Py_ssize_t nn = b->len - start;
        uint64_t h = 1469598103934665603ULL;
        for (Py_ssize_t i = 0; i < nn; i++) { h ^= nm[i]; h *= 1099511628211ULL; }
        h |= 1;
        if (f->seen_len * 2 >= f->seen_cap) {
            Py_ssize_t cap = f->seen_cap ? f->seen_cap * 2 : 1024;
            uint64_t *t = PyMem_Calloc(cap, sizeof(uint64_t));
            if (!t) { PyErr_NoMemory(); return -1; }
            for (Py_ssize_t i = 0; i < f->seen_cap; i++) {
                uint64_t x = f->seen[i];
                if (!x) continue;
                Py_ssize_t j = (Py_ssize_t)(x & (cap - 1));
                while (t[j]) j = (j + 1) & (cap - 1);
                t[j] = x;
            }
            PyMem_Free(f->seen); f->seen = t; f->seen_cap = cap;
        }
        Py_ssize_t j = (Py_ssize_t)(h & (f->seen_cap - 1));
        while (f->seen[j] && f->seen[j] != h) j = (j + 1) & (f->seen_cap - 1);
        if (!f->seen[j]) {
            f->seen[j] = h; f->seen_len++;
            PyObject *k = PyBytes_FromStringAndSize((const char *)nm, nn);
            PyObject *v = PyBytes_FromStringAndSize((const char *)mod, mn);
            if (!k || !v) { Py_XDECREF(k); Py_XDECREF(v); return -1; }
            int rc = PyDict_SetDefault(f->modules, k, v) ? 0 : -1;
            Py_DECREF(k); Py_DECREF(v);
            if (rc < 0) return -1;
        }
    }
    return 0;
}


static inline uint64_t mix(uint64_t h, uint64_t w) {
    h = (h ^ w) * 0xff51afd7ed558ccdULL;
    return h ^ (h >> 32);
}

/* The first 40 and last 16 bytes and the length: a frame line's address and symbol are
 * at its start, its module at its end; lines alike there are told apart by memcmp. */
static inline uint64_t line_hash(const unsigned char *s, Py_ssize_t n, int java) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n ^ ((uint64_t)java << 63);
    uint64_t w;
    if (n >= 56) {
        for (int i = 0; i < 40; i += 8) { memcpy(&w, s + i, 8); h = mix(h, w); }
        memcpy(&w, s + n - 16, 8); h = mix(h, w);
        memcpy(&w, s + n - 8, 8); h = mix(h, w);
    } else {
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8) { memcpy(&w, s + i, 8); h = mix(h, w); }
        w = 0;
        memcpy(&w, s + i, (size_t)(n - i));
        h = mix(h, w);
    }
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 29;
    return h | 1;
}

static int items_push(Folder *f, Py_ssize_t v) {
    if (f->items_len == f->items_cap) {
        Py_ssize_t cap = f->items_cap ? f->items_cap * 2 : 256;
        Py_ssize_t *p = PyMem_Realloc(f->items, cap * sizeof(Py_ssize_t));
        if (!p) { PyErr_NoMemory(); return -1; }
        f->items = p; f->items_cap = cap;
    }
    f->items[f->items_len++] = v;
    if (v < 0) f->sample_slow = 1;
    return 0;
}

/* a cached line: 1 with its id (-1: a frame the Perl script skips), 0 if absent */
static int cache_get(Folder *f, const unsigned char *s, Py_ssize_t n, uint64_t h,
                     Py_ssize_t *id) {
    if (!f->cache_cap) return 0;
    Py_ssize_t mask = f->cache_cap - 1, j = (Py_ssize_t)(h & mask);
    while (f->cache[j].h) {
        struct centry *e = &f->cache[j];
        if (e->h == h && e->line_len == n && !memcmp(f->cache_bytes.p + e->line_off, s, n)) {
            *id = e->id;
            return 1;
        }
        j = (j + 1) & mask;
    }
    return 0;
}

static int cache_put(Folder *f, const unsigned char *s, Py_ssize_t n, uint64_t h, int skipped,
                     Py_ssize_t first_entry, Py_ssize_t *id_out) {
    *id_out = -2;                                          /* not cached */
    if (f->cache_bytes.len > f->cache_max) return 0;   /* memory stays bounded */
    if ((f->cache_len + 1) * 2 > f->cache_cap) {
        Py_ssize_t cap = f->cache_cap ? f->cache_cap * 2 : 4096;
        struct centry *t = PyMem_Calloc(cap, sizeof(struct centry));
        if (!t) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t i = 0; i < f->cache_cap; i++) {
            if (!f->cache[i].h) continue;
            Py_ssize_t j = (Py_ssize_t)(f->cache[i].h & (cap - 1));
            while (t[j].h) j = (j + 1) & (cap - 1);
            t[j] = f->cache[i];
        }
        PyMem_Free(f->cache); f->cache = t; f->cache_cap = cap;
    }
    struct centry e;
    e.h = h; e.line_off = f->cache_bytes.len; e.line_len = n;
    if (buf_add(&f->cache_bytes, (const char *)s, n) < 0) return -1;
    if (skipped) e.id = -1;
    else {
        if (f->lm_len == f->lm_cap) {
            Py_ssize_t cap = f->lm_cap ? f->lm_cap * 2 : 1024;
            struct lmeta *p = PyMem_Realloc(f->lm, cap * sizeof(struct lmeta));
            if (!p) { PyErr_NoMemory(); return -1; }
            f->lm = p; f->lm_cap = cap;
        }
        e.id = f->lm_len;
        f->lm[f->lm_len].names_off = f->cache_bytes.len;
        f->lm[f->lm_len].nnames = f->entries.len - first_entry;
        f->lm_len++;
        for (Py_ssize_t k = first_entry; k < f->entries.len; k++) {
            Py_ssize_t len = f->entries.p[k].len;
            if (buf_add(&f->cache_bytes, (const char *)&len, sizeof len) < 0) return -1;
            if (buf_add(&f->cache_bytes, f->names.p + f->entries.p[k].off, len) < 0) return -1;
        }
    }
    Py_ssize_t j = (Py_ssize_t)(h & (f->cache_cap - 1));
    while (f->cache[j].h) j = (j + 1) & (f->cache_cap - 1);
    f->cache[j] = e;
    f->cache_len++;
    *id_out = e.id;
    return 0;
}

static int do_frame(Folder *f, const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t pa, pb, fa, fb, ma, mb, j, close;
    if (!frame_parts(s, n, &pa, &pb, &fa, &fb, &ma, &mb, &j, &close)) return 0;
    if (f->o_strict) {
        if (!f->in_sample) { fold_error("frame_outside", f->lineno, (const char *)s, n); return -1; }
        int bad = fa < j;
        for (Py_ssize_t i = pa; i < pb && !bad; i++) if (!is_hex(s[i])) bad = 1;
        for (Py_ssize_t i = fa; i < fb && !bad; i++) if (s[i] == '\t') bad = 1;
        for (Py_ssize_t i = close + 1; i < n && !bad; i++)
            if (!(s[i] == ' ' || s[i] == '\t' || s[i] == 0x0b || s[i] == 0x0c || s[i] == '\r')) bad = 1;
        if (bad) { fold_error("frame", f->lineno, (const char *)s, n); return -1; }
    }
    if (!f->have_pname) return 1;
    int java = !f->o_pid && !f->o_tid && f->pname.len >= 4 && !memcmp(f->pname.p, "java", 4);
    /* strip a trailing +0x<lowercase hex> */
    Py_ssize_t e = fb;
    for (Py_ssize_t i = fb - 3; i >= fa; i--) {
        if (s[i] == '+' && s[i + 1] == '0' && s[i + 2] == 'x') {
            if (i + 3 < fb) {
                int ok = 1;
                for (Py_ssize_t q = i + 3; q < fb; q++) if (!is_lowhex(s[q])) { ok = 0; break; }
                if (ok) e = i;
            }
            break;
        }
    }
    if (e > fa && s[fa] == '(') return 1;
    /* split on "->", trailing empty fields dropped */
    Py_ssize_t last = e;   /* end of the last non-empty field */
    {
        /* find the end after dropping trailing empty fields */
        while (last >= fa + 2 && s[last - 1] == '>' && s[last - 2] == '-') last -= 2;
    }
    Py_ssize_t first_entry = f->entries.len;
    if (last > fa) {
        Py_ssize_t a = fa;
        int first = 1;
        for (Py_ssize_t i = fa; ; ) {
            Py_ssize_t nxt = -1;
            for (Py_ssize_t q = i; q + 1 < last; q++) if (s[q] == '-' && s[q + 1] == '>') { nxt = q; break; }
            Py_ssize_t b = nxt < 0 ? last : nxt;
            if (emit_name(f, s + a, b - a, s + pa, pb - pa, s + ma, mb - ma, java, first) < 0) return -1;
            first = 0;
            if (nxt < 0) break;
            a = i = nxt + 2;
        }
    }
    if (spans_add(&f->groups, first_entry, f->entries.len - first_entry) < 0) return -1;
    if (items_push(f, -f->groups.len) < 0) return -1;   /* -(group index + 1) */
    return 1;
}

static int is_time_tok(const unsigned char *t, Py_ssize_t n) {
    if (n < 4 || t[n - 1] != ':') return 0;
    Py_ssize_t i = 0;
    while (i < n - 1 && is_digit(t[i])) i++;
    if (i == 0 || i >= n - 1 || t[i] != '.') return 0;
    Py_ssize_t j = i + 1;
    while (j < n - 1 && is_digit(t[j])) j++;
    return j == n - 1 && j > i + 1;
}
static int is_cpu_tok(const unsigned char *t, Py_ssize_t n) {
    if (n < 3 || t[0] != '[' || t[n - 1] != ']') return 0;
    for (Py_ssize_t i = 1; i < n - 1; i++) if (!is_digit(t[i])) return 0;
    return 1;
}

static int check_header(Folder *f, const unsigned char *s, Py_ssize_t n, Py_ssize_t comm_end) {
    /* the comm's last token must not be a TIME: or [CPU] field */
    Py_ssize_t e = comm_end;
    while (e > 0 && is_ws(s[e - 1])) e--;
    Py_ssize_t b = e;
    while (b > 0 && !is_ws(s[b - 1])) b--;
    if (e > b && (is_time_tok(s + b, e - b) || is_cpu_tok(s + b, e - b))) goto bad;
    Py_ssize_t p = comm_end;
    while (p < n && is_ws(s[p])) p++;
    while (p < n && !is_ws(s[p])) p++;
    int stage = 0;
    while (1) {
        while (p < n && is_ws(s[p])) p++;
        if (p >= n) break;
        Py_ssize_t a = p;
        while (p < n && !is_ws(s[p])) p++;
        const unsigned char *t = s + a; Py_ssize_t tn = p - a;
        int digits = 1;
        for (Py_ssize_t i = 0; i < tn; i++) if (!is_digit(t[i])) { digits = 0; break; }
        if (stage <= 0 && is_cpu_tok(t, tn)) stage = 1;
        else if (stage <= 1 && is_time_tok(t, tn)) stage = 2;
        else if (stage <= 2 && digits) stage = 3;
        else if (stage <= 3 && tn > 1 && t[tn - 1] == ':' && !is_digit(t[0])) stage = 4;
        else goto bad;
    }
    return 0;
bad:
    fold_error("header", f->lineno, (const char *)s, n);
    return -1;
}

/* the folded stack: pname, then the lines' names from the root (the last line) down */
static int build_key(Folder *f, const char *pname, Py_ssize_t plen, const Py_ssize_t *items,
                     Py_ssize_t n, buf_t *k) {
    k->len = 0;
    if (buf_add(k, pname, plen) < 0) return -1;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        Py_ssize_t it = items[i];
        if (it >= 0) {
            const char *src = f->cache_bytes.p + f->lm[it].names_off;
            Py_ssize_t pos = 0;
            for (Py_ssize_t q = 0; q < f->lm[it].nnames; q++) {
                Py_ssize_t len;
                memcpy(&len, src + pos, sizeof len);
                pos += sizeof len;
                if (buf_reserve(k, len + 1) < 0) return -1;
                k->p[k->len++] = ';';
                memcpy(k->p + k->len, src + pos, len);
                k->len += len;
                pos += len;
            }
        } else {
            span_t g = f->groups.p[-it - 1];
            for (Py_ssize_t q = g.off; q < g.off + g.len; q++) {
                span_t sp = f->entries.p[q];
                if (buf_reserve(k, sp.len + 1) < 0) return -1;
                k->p[k->len++] = ';';
                memcpy(k->p + k->len, f->names.p + sp.off, sp.len);
                k->len += sp.len;
            }
        }
    }
    return 0;
}

/* collapsed[key] += weight, as Perl adds: unsigned integers while the sum fits */
static int dict_add(Folder *f, const char *key_p, Py_ssize_t key_n, uint64_t u, double d, int nv) {
    PyObject *key = PyBytes_FromStringAndSize(key_p, key_n);
    if (!key) return -1;
    PyObject *w = nv ? PyFloat_FromDouble(d) : PyLong_FromUnsignedLongLong(u);
    if (!w) { Py_DECREF(key); return -1; }
    PyObject *old = PyDict_GetItemWithError(f->collapsed, key);
    PyObject *sum = NULL;
    if (!old) {
        if (PyErr_Occurred()) goto fail;
        sum = w; Py_INCREF(sum);
    } else if (PyLong_CheckExact(old) && !nv) {
        unsigned long long a = PyLong_AsUnsignedLongLong(old);
        if (a == (unsigned long long)-1 && PyErr_Occurred()) goto fail;
        if (a <= UV_MAX_U64 - u) sum = PyLong_FromUnsignedLongLong(a + u);
        else sum = PyFloat_FromDouble((double)a + (double)u);
    } else {
        double a = PyFloat_Check(old) ? PyFloat_AS_DOUBLE(old) : PyLong_AsDouble(old);
        sum = PyFloat_FromDouble(a + (nv ? d : (double)u));
    }
    if (!sum) goto fail;
    if (PyDict_SetItem(f->collapsed, key, sum) < 0) { Py_DECREF(sum); goto fail; }
    Py_DECREF(sum); Py_DECREF(key); Py_DECREF(w);
    return 0;
fail:
    Py_DECREF(key); Py_DECREF(w);
    return -1;
}


static int st_flush(Folder *f) {
    for (Py_ssize_t i = 0; i < f->st_cap; i++) {
        struct sentry *e = &f->st[i];
        if (!e->h) continue;
        const char *rec = f->st_bytes.p + e->off;
        Py_ssize_t plen, n;
        memcpy(&plen, rec, sizeof plen);
        memcpy(&n, rec + sizeof plen, sizeof n);
        const char *pname = rec + 2 * sizeof(Py_ssize_t);
        Py_ssize_t *ids = PyMem_Malloc((n ? n : 1) * sizeof(Py_ssize_t));
        if (!ids) { PyErr_NoMemory(); return -1; }
        memcpy(ids, pname + plen, n * sizeof(Py_ssize_t));
        int rc = build_key(f, pname, plen, ids, n, &f->key);
        PyMem_Free(ids);
        if (rc < 0 || dict_add(f, f->key.p, f->key.len, e->u, e->d, e->nv) < 0) return -1;
        e->h = 0;
    }
    f->st_len = 0;
    f->st_bytes.len = 0;
    return 0;
}

/* a sample made of cached lines only: counted by (pname, ids) without building its text */
static int st_add(Folder *f, uint64_t wu, double wd, int wnv) {
    const char *pn = f->pname.p;
    Py_ssize_t plen = f->pname.len, n = f->items_len;
    uint64_t h = 0x2545F4914F6CDD1DULL ^ (uint64_t)plen;
    Py_ssize_t i = 0;
    uint64_t w;
    for (; i + 8 <= plen; i += 8) { memcpy(&w, pn + i, 8); h = mix(h, w); }
    w = 0; memcpy(&w, pn + i, (size_t)(plen - i)); h = mix(h, w);
    for (Py_ssize_t q = 0; q < n; q++) h = mix(h, (uint64_t)f->items[q]);
    h = mix(h, (uint64_t)n) | 1;
    if ((f->st_len + 1) * 2 > f->st_cap) {
        Py_ssize_t cap = f->st_cap ? f->st_cap * 2 : 1024;
        struct sentry *t = PyMem_Calloc(cap, sizeof(struct sentry));
        if (!t) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t a = 0; a < f->st_cap; a++) {
            if (!f->st[a].h) continue;
            Py_ssize_t j = (Py_ssize_t)(f->st[a].h & (cap - 1));
            while (t[j].h) j = (j + 1) & (cap - 1);
            t[j] = f->st[a];
        }
        PyMem_Free(f->st); f->st = t; f->st_cap = cap;
    }
    Py_ssize_t mask = f->st_cap - 1, j = (Py_ssize_t)(h & mask);
    while (f->st[j].h) {
        struct sentry *e = &f->st[j];
        if (e->h == h) {
            const char *rec = f->st_bytes.p + e->off;
            Py_ssize_t rp, rn;
            memcpy(&rp, rec, sizeof rp);
            memcpy(&rn, rec + sizeof rp, sizeof rn);
            const char *body = rec + 2 * sizeof(Py_ssize_t);
            if (rp == plen && rn == n && !memcmp(body, pn, plen) &&
                !memcmp(body + plen, f->items, n * sizeof(Py_ssize_t))) {
                if (!e->nv && !wnv && e->u <= UV_MAX_U64 - wu) e->u += wu;
                else {
                    double a = e->nv ? e->d : (double)e->u;
                    e->d = a + (wnv ? wd : (double)wu);
                    e->nv = 1;
                }
                return 0;
            }
        }
        j = (j + 1) & mask;
    }
    struct sentry e;
    e.h = h; e.off = f->st_bytes.len; e.u = wnv ? 0 : wu; e.d = wd; e.nv = wnv;
    if (buf_add(&f->st_bytes, (const char *)&plen, sizeof plen) < 0 ||
        buf_add(&f->st_bytes, (const char *)&n, sizeof n) < 0 ||
        buf_add(&f->st_bytes, pn, plen) < 0 ||
        buf_add(&f->st_bytes, (const char *)f->items, n * sizeof(Py_ssize_t)) < 0) return -1;
    f->st[j] = e;
    f->st_len++;
    if (f->st_bytes.len > f->table_max) return st_flush(f);   /* memory stays bounded */
    return 0;
}

static int set_count(Folder *f) {
    uint64_t wu = 1; double wd = 0; int wnv = 0;
    if (!f->o_samples) { wu = f->period_u; wd = f->period_d; wnv = f->period_nv; }
    if (!f->sample_slow) return st_add(f, wu, wd, wnv);
    if (build_key(f, f->pname.p, f->pname.len, f->items, f->items_len, &f->key) < 0) return -1;
    return dict_add(f, f->key.p, f->key.len, wu, wd, wnv);
}

static int do_line(Folder *f, const unsigned char *s, Py_ssize_t n) {
    /* s: the line without its "\n" */
    f->lineno++;
    if (f->lineno == 1 && n >= 7 && !memcmp(s, "PERFILE", 7)) {
        fold_error("perf_data", 1, (const char *)s, n < 16 ? n : 16); return -1;
    }
    if (n > f->max_line) { fold_error("long_line", f->lineno, (const char *)s, n); return -1; }
    if (f->partial && f->o_strict) { fold_error("midline", f->lineno, "", 0); return -1; }
    if (n && s[0] == '#') return 0;
    if (n == 0) {
        f->in_sample = 0;
        if (!f->have_pname) return 0;
        if (set_count(f) < 0) return -1;
        f->samples++;
        f->names.len = 0; f->entries.len = 0; f->groups.len = 0;
        f->items_len = 0; f->sample_slow = 0;
        f->have_pname = 0;
        return 0;
    }
    /* a frame line seen before in a sample: its names from the cache (a line starting
     * with whitespace is never a header) */
    uint64_t h = 0;
    if (is_ws(s[0]) && f->have_pname) {
        int java = !f->o_pid && !f->o_tid && f->pname.len >= 4 && !memcmp(f->pname.p, "java", 4);
        h = line_hash(s, n, java);
        Py_ssize_t id;
        if (cache_get(f, s, n, h, &id)) return id >= 0 ? items_push(f, id) : 0;
        Py_ssize_t first_entry = f->entries.len, groups_before = f->groups.len;
        Py_ssize_t names_before = f->names.len, items_before = f->items_len;
        int slow_before = f->sample_slow;
        int r = do_frame(f, s, n);
        if (r < 0) return -1;
        if (r != 1) goto unrecognized;
        int skipped = f->groups.len == groups_before;
        if (cache_put(f, s, n, h, skipped, first_entry, &id) < 0) return -1;
        if (!skipped && id >= 0) {
            /* cached: the sample refers to the line by id, its names live in the cache */
            f->groups.len = groups_before; f->entries.len = first_entry;
            f->names.len = names_before; f->items_len = items_before;
            f->sample_slow = slow_before;
            return items_push(f, id);
        }
        return 0;
    }
    Py_ssize_t ce, pa, pb, ta, tb;
    if (header(s, n, &ce, &pa, &pb, &ta, &tb)) {
        if (f->o_strict) {
            if (f->in_sample) { fold_error("no_blank", f->lineno, (const char *)s, n); return -1; }
            if (check_header(f, s, n, ce) < 0) return -1;
            f->in_sample = 1;
            f->sample_line = f->lineno;
        }
        Py_ssize_t da = -1, db = -1, ea, eb;
        int has_ev = event(s, n, &da, &db, &ea, &eb);
        if (has_ev) {
            Py_ssize_t en = eb - ea;
            if (!(f->last_event.len == en && !memcmp(f->last_event.p, s + ea, en))) {
                PyObject *ev = PyBytes_FromStringAndSize((const char *)s + ea, en);
                if (!ev) return -1;
                if (!PyDict_SetDefault(f->events, ev, Py_None)) { Py_DECREF(ev); return -1; }
                Py_DECREF(ev);
                f->last_event.len = 0;
                if (buf_add(&f->last_event, (const char *)s + ea, en) < 0) return -1;
            }
            if (!f->have_filter) {
                f->event_filter.len = 0;
                if (buf_add(&f->event_filter, (const char *)s + ea, en) < 0) return -1;
                f->have_filter = 1; f->defaulted = 1;
            } else if (!(f->event_filter.len == en && !memcmp(f->event_filter.p, s + ea, en))) {
                if (f->defaulted && !f->filter_warning) {
                    f->filter_warning = PyBytes_FromStringAndSize((const char *)s + ea, en);
                    if (!f->filter_warning) return -1;
                }
                f->skipped++;
                return 0;
            }
        }
        /* period: Perl's numification; "" and "0" mean 1 */
        f->period_nv = 0; f->period_u = 1;
        if (da >= 0 && !(db - da == 1 && s[da] == '0')) {
            uint64_t v = 0; int ovf = 0;
            for (Py_ssize_t i = da; i < db; i++) {
                unsigned d = s[i] - '0';
                if (v > (UV_MAX_U64 - d) / 10) { ovf = 1; break; }
                v = v * 10 + d;
            }
            if (!ovf) f->period_u = v;
            else {
                PyObject *str = PyUnicode_FromStringAndSize((const char *)s + da, db - da);
                if (!str) return -1;
                PyObject *fl = PyFloat_FromString(str);
                Py_DECREF(str);
                if (!fl) return -1;
                f->period_d = PyFloat_AS_DOUBLE(fl); f->period_nv = 1;
                Py_DECREF(fl);
            }
        }
        /* pname */
        buf_t *p = &f->pname;
        p->len = 0;
        if (buf_add(p, (const char *)s, ce) < 0) return -1;
        if (f->o_tid || f->o_pid) {
            const char *pid; Py_ssize_t pidn; const char *tid; Py_ssize_t tidn;
            if (ta < 0) { tid = (const char *)s + pa; tidn = pb - pa; pid = "?"; pidn = 1; }
            else { pid = (const char *)s + pa; pidn = pb - pa; tid = (const char *)s + ta; tidn = tb - ta; }
            if (buf_add(p, "-", 1) < 0 || buf_add(p, pid, pidn) < 0) return -1;
            if (f->o_tid && (buf_add(p, "/", 1) < 0 || buf_add(p, tid, tidn) < 0)) return -1;
        }
        for (Py_ssize_t i = 0; i < p->len; i++) if (p->p[i] == ' ') p->p[i] = '_';
        f->have_pname = 1;
        return 0;
    }
    int r = do_frame(f, s, n);
    if (r < 0) return -1;
    if (r == 1) return 0;
unrecognized:
    if (f->o_strict) { fold_error("unrecognized", f->lineno, (const char *)s, n); return -1; }
    f->unrecognized++;
    if (!f->first_unrec_text) {
        f->first_unrec_line = f->lineno;
        f->first_unrec_text = PyBytes_FromStringAndSize((const char *)s, n < 200 ? n : 200);
        if (!f->first_unrec_text) return -1;
    }
    return 0;
}

static void too_long(Folder *f, const unsigned char *s, Py_ssize_t n) {
    f->lineno++;
    if (f->lineno == 1 && n >= 7 && !memcmp(s, "PERFILE", 7))
        fold_error("perf_data", 1, (const char *)s, 16);
    else
        fold_error("long_line", f->lineno, (const char *)s, n);
}

static PyObject *Folder_feed(Folder *f, PyObject *arg) {
    Py_buffer view;
    if (f->finished) { PyErr_SetString(PyExc_ValueError, "feed() after finish()"); return NULL; }
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *d = view.buf;
    Py_ssize_t n = view.len, i = 0;
    f->nbytes += n;
    if (n) f->last_newline = d[n - 1] == '\n';
    if (f->carry.len) {
        const unsigned char *nl = memchr(d, '\n', n);
        Py_ssize_t take = nl ? (nl - d) : n;
        if (f->carry.len + take > f->max_line + 1) {   /* refuse now: memory stays bounded */
            if (buf_add(&f->carry, (const char *)d, take < 200 ? take : 200) < 0) goto fail;
            too_long(f, (const unsigned char *)f->carry.p, f->carry.len);
            goto fail;
        }
        if (buf_add(&f->carry, (const char *)d, take) < 0) goto fail;
        if (!nl) { PyBuffer_Release(&view); Py_RETURN_NONE; }
        if (do_line(f, (const unsigned char *)f->carry.p, f->carry.len) < 0) goto fail;
        f->carry.len = 0;
        i = take + 1;
    }
    while (i < n) {
        const unsigned char *nl = memchr(d + i, '\n', n - i);
        if (!nl) {
            Py_ssize_t rest = n - i;
            if (rest > f->max_line + 1) { too_long(f, d + i, rest); goto fail; }
            if (buf_add(&f->carry, (const char *)d + i, rest) < 0) goto fail;
            break;
        }
        Py_ssize_t len = nl - (d + i);
        if (do_line(f, d + i, len) < 0) goto fail;
        i += len + 1;
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *Folder_finish(Folder *f, PyObject *Py_UNUSED(ignored)) {
    if (f->finished) Py_RETURN_NONE;
    f->finished = 1;
    if (f->carry.len) {
        f->partial = 1;   /* the last line, without its newline */
        if (do_line(f, (const unsigned char *)f->carry.p, f->carry.len) < 0) return NULL;
        f->carry.len = 0;
    }
    if (f->o_strict) {
        if (f->lineno && !f->last_newline) return fold_error("midline", f->lineno, "", 0);
        if (f->in_sample && f->have_pname) return fold_error("open_sample", f->sample_line, "", 0);
    }
    Py_RETURN_NONE;
}

static PyObject *Folder_result(Folder *f, PyObject *Py_UNUSED(ignored)) {
    if (st_flush(f) < 0) return NULL;
    PyObject *events = PyDict_Keys(f->events);
    if (!events) return NULL;
    PyObject *first = Py_None;
    Py_INCREF(first);
    if (f->first_unrec_text) {
        Py_DECREF(first);
        first = Py_BuildValue("(LO)", f->first_unrec_line, f->first_unrec_text);
        if (!first) { Py_DECREF(events); return NULL; }
    }
    PyObject *fw = f->filter_warning ? f->filter_warning : Py_None;
    PyObject *ef = PyUnicode_DecodeUTF8(f->event_filter.p ? f->event_filter.p : "",
                                        f->event_filter.len, "surrogateescape");
    if (!ef) { Py_DECREF(events); Py_DECREF(first); return NULL; }
    PyObject *stats = Py_BuildValue("{sLsLsNsLsLsLsNsOsN}", "samples", f->samples, "skipped",
                                    f->skipped, "events", events, "lines", f->lineno, "bytes",
                                    f->nbytes, "unrecognized", f->unrecognized,
                                    "first_unrecognized", first, "filter_warning", fw,
                                    "event_filter", ef);
    if (!stats) return NULL;
    return Py_BuildValue("(OON)", f->collapsed, f->modules, stats);
}

static PyMethodDef Folder_methods[] = {
    {"feed", (PyCFunction)Folder_feed, METH_O, "Fold a chunk of perf script text (bytes-like)."},
    {"finish", (PyCFunction)Folder_finish, METH_NOARGS, "End of input (strict checks)."},
    {"result", (PyCFunction)Folder_result, METH_NOARGS,
     "(collapsed {bytes: int|float}, modules {bytes: bytes}, stats dict)."},
    {NULL, NULL, 0, NULL}
};

static PyTypeObject FolderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profkit._fold.Folder",
    .tp_basicsize = sizeof(Folder),
    .tp_dealloc = (destructor)Folder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "stackcollapse-perf.pl's folding, streaming (see profkit.parse.perf_script).",
    .tp_methods = Folder_methods,
    .tp_init = (initproc)Folder_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef fold_module = {
    PyModuleDef_HEAD_INIT, "profkit._fold",
    "Compiled core of profkit.parse.perf_script (see that module).", -1, NULL,
    NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC PyInit__fold(void) {
    if (PyType_Ready(&FolderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&fold_module);
    if (!m) return NULL;
    FoldError = PyErr_NewException("profkit._fold.FoldError", NULL, NULL);
    if (!FoldError || PyModule_AddObject(m, "FoldError", FoldError) < 0) return NULL;
    Py_INCREF(FoldError);
    Py_INCREF(&FolderType);
    if (PyModule_AddObject(m, "Folder", (PyObject *)&FolderType) < 0) return NULL;
    return m;
}
