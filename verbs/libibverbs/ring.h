/* The single-producer/single-consumer rings of shared memory, as package
 * shmem lays them out and runs them (shmem/doc.go): a 256-byte header of
 * free-running indices and sleep flags, then the slots. The peer is not
 * trusted: an index outside what is possible breaks the ring, which then
 * reports nothing, never an access outside it. The atomics are
 * sequentially consistent, as the Go side's, so that a producer's commit
 * and a consumer's sleep request never miss each other. */
#ifndef TAPROCE_RING_H
#define TAPROCE_RING_H

#include <sched.h>
#include <stddef.h>
#include <stdint.h>

#include "abi.h"

struct tp_ring {
	uint8_t *slots;
	uint32_t slot_size;
	uint64_t nslots, mask;
	uint64_t *prod_idx, *cons_idx;
	uint32_t *cons_sleep, *prod_sleep;
	uint64_t prod, prod_cons; /* producer's own */
	uint64_t cons, cons_prod; /* consumer's own */
	int broken;
};

#define tp_load64(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define tp_load32(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define tp_store64(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define tp_store32(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define tp_xchg32(p, v) __atomic_exchange_n((p), (v), __ATOMIC_SEQ_CST)

/* tp_ring_attach checks the header at mem (len bytes) as shmem.AttachRing
 * does; 0 on success, -1 (errno EPROTO) on a header it cannot trust. */
int tp_ring_attach(struct tp_ring *r, uint8_t *mem, size_t len);

static inline uint8_t *tp_ring_slot(struct tp_ring *r, uint64_t i)
{
	return r->slots + (i & r->mask) * r->slot_size;
}

/* Producer side. */

static inline uint64_t tp_ring_free(struct tp_ring *r)
{
	if (r->broken)
		return 0;
	uint64_t c = tp_load64(r->cons_idx);
	if (c - r->prod_cons > r->prod - r->prod_cons) {
		r->broken = 1;
		return 0;
	}
	r->prod_cons = c;
	return r->nslots - (r->prod - c);
}

/* tp_ring_reserve_at returns the i-th free slot after the next one, or
 * NULL when fewer than i+1 are free. */
static inline uint8_t *tp_ring_reserve_at(struct tp_ring *r, uint64_t i)
{
	if (r->broken || i >= r->nslots)
		return NULL;
	if (r->prod - r->prod_cons + i >= r->nslots && tp_ring_free(r) <= i)
		return NULL;
	return tp_ring_slot(r, r->prod + i);
}

/* tp_ring_reserve_taken is tp_ring_reserve_at for a producer whose queue
 * has room by the appliance's retire count: a full ring then holds slots
 * the appliance has taken but not yet given back — it hands a batch of
 * WQEs to its transport, which may retire them at once, before it releases
 * their slots. It retries, spinning and then yielding, for about a
 * millisecond before it reports the ring full. */
static inline uint8_t *tp_ring_reserve_taken(struct tp_ring *r, uint64_t i)
{
	for (int k = 0;; k++) {
		uint8_t *s = tp_ring_reserve_at(r, i);
		if (s != NULL || r->broken || k >= 1100)
			return s;
		if (k >= 100)
			sched_yield();
	}
}

/* tp_ring_commit publishes n reserved slots; it returns 1 when the
 * consumer asked to be woken (then the producer rings its doorbell). */
static inline int tp_ring_commit(struct tp_ring *r, uint64_t n)
{
	if (n == 0)
		return 0;
	r->prod += n;
	tp_store64(r->prod_idx, r->prod);
	return tp_load32(r->cons_sleep) != 0 && tp_xchg32(r->cons_sleep, 0) != 0;
}

/* Consumer side. */

static inline uint64_t tp_ring_len(struct tp_ring *r)
{
	if (r->broken)
		return 0;
	uint64_t p = tp_load64(r->prod_idx);
	if (p - r->cons_prod > r->cons + r->nslots - r->cons_prod) {
		r->broken = 1;
		return 0;
	}
	r->cons_prod = p;
	return p - r->cons;
}

static inline uint8_t *tp_ring_peek_at(struct tp_ring *r, uint64_t i)
{
	if (r->broken || i >= r->nslots)
		return NULL;
	if (r->cons_prod - r->cons <= i && tp_ring_len(r) <= i)
		return NULL;
	return tp_ring_slot(r, r->cons + i);
}

static inline int tp_ring_release(struct tp_ring *r, uint64_t n)
{
	if (n == 0)
		return 0;
	r->cons += n;
	tp_store64(r->cons_idx, r->cons);
	return tp_load32(r->prod_sleep) != 0 && tp_xchg32(r->prod_sleep, 0) != 0;
}

/* Little-endian field access in slots (the host is little-endian: the
 * library refuses to build elsewhere). */
static inline uint64_t tp_get64(const uint8_t *p) { uint64_t v; __builtin_memcpy(&v, p, 8); return v; }
static inline uint32_t tp_get32(const uint8_t *p) { uint32_t v; __builtin_memcpy(&v, p, 4); return v; }
static inline uint16_t tp_get16(const uint8_t *p) { uint16_t v; __builtin_memcpy(&v, p, 2); return v; }
static inline void tp_put64(uint8_t *p, uint64_t v) { __builtin_memcpy(p, &v, 8); }
static inline void tp_put32(uint8_t *p, uint32_t v) { __builtin_memcpy(p, &v, 4); }
static inline void tp_put16(uint8_t *p, uint16_t v) { __builtin_memcpy(p, &v, 2); }

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "taproce's shared rings are little-endian"
#endif

#endif /* TAPROCE_RING_H */
