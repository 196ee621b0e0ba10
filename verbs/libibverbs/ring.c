#include <errno.h>

#include "ring.h"

int tp_ring_attach(struct tp_ring *r, uint8_t *mem, size_t len)
{
	if (len < TAPROCE_RING_HEADER_BYTES || ((uintptr_t)mem & 7) != 0)
		goto bad;
	uint32_t magic = tp_load32((uint32_t *)(mem + TAPROCE_RING_OFF_MAGIC));
	uint32_t version = tp_load32((uint32_t *)(mem + TAPROCE_RING_OFF_VERSION));
	uint64_t slots = tp_load32((uint32_t *)(mem + TAPROCE_RING_OFF_SLOTS));
	uint64_t size = tp_load32((uint32_t *)(mem + TAPROCE_RING_OFF_SLOT_SIZE));
	if (magic != TAPROCE_RING_MAGIC || version != TAPROCE_RING_VERSION || slots == 0 || slots > (1u << 24) ||
	    (slots & (slots - 1)) != 0 || size == 0 || size > (1u << 24) || size % 8 != 0 ||
	    len < TAPROCE_RING_HEADER_BYTES + slots * size)
		goto bad;
	r->prod_idx = (uint64_t *)(mem + TAPROCE_RING_OFF_PROD);
	r->cons_idx = (uint64_t *)(mem + TAPROCE_RING_OFF_CONS);
	r->cons_sleep = (uint32_t *)(mem + TAPROCE_RING_OFF_CONS_SLEEP);
	r->prod_sleep = (uint32_t *)(mem + TAPROCE_RING_OFF_PROD_SLEEP);
	uint64_t prod = tp_load64(r->prod_idx), cons = tp_load64(r->cons_idx);
	if (prod - cons > slots)
		goto bad;
	r->slots = mem + TAPROCE_RING_HEADER_BYTES;
	r->slot_size = (uint32_t)size;
	r->nslots = slots;
	r->mask = slots - 1;
	r->prod = prod;
	r->prod_cons = cons;
	r->cons = cons;
	r->cons_prod = prod;
	r->broken = 0;
	return 0;
bad:
	errno = EPROTO;
	return -1;
}
