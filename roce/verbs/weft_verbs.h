// weft_verbs.h: the C side of Weft's libibverbs binding (see cverbs.go).
// Every function is static inline, so each cgo file that includes it
// compiles only what it uses.
#ifndef WEFT_VERBS_H
#define WEFT_VERBS_H
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct weft_swr {
	uint64_t wr_id;
	uint64_t raddr;
	uint64_t compare_add;
	uint64_t swap;
	uint32_t rkey;
	uint32_t imm;
	uint32_t opcode;
	uint32_t flags;
	uint32_t nsge;
	uint32_t sge;
};

struct weft_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t byte_len;
	uint32_t imm;
	uint32_t wc_flags;
	uint32_t vendor_err;
};

struct weft_q {
	struct ibv_qp *qp;
	struct ibv_cq *scq, *rcq;
	struct ibv_ah *ah;
	uint32_t remote_qpn, remote_qkey;
	int bad;
	int max_post, max_sge;
	struct weft_swr *swr;
	struct ibv_sge *sge;
	struct ibv_send_wr *wr;
	int rdepth;
	uint64_t rbase;
	uint32_t rslot, rlkey;
	struct ibv_recv_wr *rwr;
	struct ibv_sge *rsge;
	int nwc;
	struct ibv_wc *swc, *rwc;
	struct weft_wc *sout, *rout;
};

static inline struct weft_q *weft_q_new(int max_post, int max_sge, int rdepth, int nwc) {
	struct weft_q *q = calloc(1, sizeof *q);
	if (!q) return NULL;
	q->max_post = max_post; q->max_sge = max_sge; q->rdepth = rdepth; q->nwc = nwc;
	q->swr = calloc(max_post, sizeof *q->swr);
	q->sge = calloc((size_t)max_post * max_sge, sizeof *q->sge);
	q->wr = calloc(max_post, sizeof *q->wr);
	q->rwr = calloc(rdepth, sizeof *q->rwr);
	q->rsge = calloc(rdepth, sizeof *q->rsge);
	q->swc = calloc(nwc, sizeof *q->swc);
	q->rwc = calloc(nwc, sizeof *q->rwc);
	q->sout = calloc(nwc, sizeof *q->sout);
	q->rout = calloc(nwc, sizeof *q->rout);
	if (!q->swr || !q->sge || !q->wr || !q->rwr || !q->rsge || !q->swc || !q->rwc || !q->sout || !q->rout) {
		free(q->swr); free(q->sge); free(q->wr); free(q->rwr); free(q->rsge);
		free(q->swc); free(q->rwc); free(q->sout); free(q->rout); free(q);
		return NULL;
	}
	return q;
}

static inline void weft_q_free(struct weft_q *q) {
	free(q->swr); free(q->sge); free(q->wr); free(q->rwr); free(q->rsge);
	free(q->swc); free(q->rwc); free(q->sout); free(q->rout); free(q);
}

// weft_build_send links the first n descriptors into an ibv_send_wr chain.
static inline void weft_build_send(struct weft_q *q, int n) {
	for (int i = 0; i < n; i++) {
		struct weft_swr *s = &q->swr[i];
		struct ibv_send_wr *w = &q->wr[i];
		memset(w, 0, sizeof *w);
		w->wr_id = s->wr_id;
		w->sg_list = s->nsge ? &q->sge[s->sge] : NULL;
		w->num_sge = s->nsge;
		w->opcode = s->opcode;
		w->send_flags = s->flags;
		w->next = i + 1 < n ? &q->wr[i + 1] : NULL;
		switch (s->opcode) {
		case IBV_WR_SEND_WITH_IMM:
			w->imm_data = htonl(s->imm);
			// fall through
		case IBV_WR_SEND:
			if (q->ah) {
				w->wr.ud.ah = q->ah;
				w->wr.ud.remote_qpn = q->remote_qpn;
				w->wr.ud.remote_qkey = q->remote_qkey;
			}
			break;
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			w->imm_data = htonl(s->imm);
			// fall through
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_READ:
			w->wr.rdma.remote_addr = s->raddr;
			w->wr.rdma.rkey = s->rkey;
			break;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			w->wr.atomic.remote_addr = s->raddr;
			w->wr.atomic.rkey = s->rkey;
			w->wr.atomic.compare_add = s->compare_add;
			w->wr.atomic.swap = s->swap;
			break;
		}
	}
}

// weft_post_send links the first n descriptors into a chain and posts it
// with one ibv_post_send. q->bad is the index of the first work request
// not posted. Without a queue pair (the binding benchmark) it only
// builds the chain.
static inline int weft_post_send(struct weft_q *q, int n) {
	weft_build_send(q, n);
	if (!q->qp) {
		q->bad = n;
		return 0;
	}
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(q->qp, q->wr, &bad);
	q->bad = bad ? (int)(bad - q->wr) : n;
	return rc;
}

// weft_post_recv posts n receive buffers, slots first, first+1, ... (mod
// rdepth), as one chain.
static inline int weft_post_recv(struct weft_q *q, uint32_t first, int n) {
	for (int i = 0; i < n; i++) {
		uint32_t slot = (first + (uint32_t)i) % (uint32_t)q->rdepth;
		struct ibv_sge *s = &q->rsge[i];
		struct ibv_recv_wr *w = &q->rwr[i];
		s->addr = q->rbase + (uint64_t)slot * q->rslot;
		s->length = q->rslot;
		s->lkey = q->rlkey;
		w->wr_id = slot;
		w->sg_list = s;
		w->num_sge = 1;
		w->next = i + 1 < n ? &q->rwr[i + 1] : NULL;
	}
	struct ibv_recv_wr *bad = NULL;
	return ibv_post_recv(q->qp, q->rwr, &bad);
}

static inline int weft_poll(struct ibv_cq *cq, struct ibv_wc *wc, struct weft_wc *out, int n) {
	int k = ibv_poll_cq(cq, n, wc);
	for (int i = 0; i < k; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].byte_len = wc[i].byte_len;
		out[i].imm = (wc[i].wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc[i].imm_data) : 0;
		out[i].wc_flags = wc[i].wc_flags;
		out[i].vendor_err = wc[i].vendor_err;
	}
	return k;
}

static inline int weft_poll_send(struct weft_q *q, int n) { return weft_poll(q->scq, q->swc, q->sout, n < q->nwc ? n : q->nwc); }
static inline int weft_poll_recv(struct weft_q *q, int n) { return weft_poll(q->rcq, q->rwc, q->rout, n < q->nwc ? n : q->nwc); }

static inline int weft_req_notify(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

// weft_get_event consumes one event of a non-blocking completion channel
// and acknowledges it at once: 1 if there was one, 0 if not, -1 on error.
static inline int weft_get_event(struct ibv_comp_channel *ch) {
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(ch, &cq, &ctx)) return errno == EAGAIN ? 0 : -1;
	ibv_ack_cq_events(cq, 1);
	return 1;
}

static inline struct ibv_qp *weft_create_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq, int ud,
		uint32_t max_send_wr, uint32_t max_recv_wr, uint32_t max_sge, uint32_t max_inline,
		uint32_t *got_inline, uint32_t *got_send_wr) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.qp_type = ud ? IBV_QPT_UD : IBV_QPT_RC;
	a.sq_sig_all = 0;
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_recv_wr = max_recv_wr;
	a.cap.max_send_sge = max_sge;
	a.cap.max_recv_sge = 1;
	a.cap.max_inline_data = max_inline;
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	if (qp) {
		*got_inline = a.cap.max_inline_data;
		*got_send_wr = a.cap.max_send_wr;
	}
	return qp;
}

static inline int weft_qp_init(struct ibv_qp *qp, uint8_t port, uint32_t qkey, int ud) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	if (ud) {
		a.qkey = qkey;
		mask |= IBV_QP_QKEY;
	} else {
		a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
		mask |= IBV_QP_ACCESS_FLAGS;
	}
	return ibv_modify_qp(qp, &a, mask);
}

static inline void weft_ah_attr(struct ibv_ah_attr *ah, uint8_t port, int sgid, const uint8_t *dgid, uint16_t dlid) {
	memset(ah, 0, sizeof *ah);
	ah->is_global = 1;
	ah->dlid = dlid;
	ah->port_num = port;
	ah->grh.hop_limit = 1;
	ah->grh.sgid_index = sgid;
	memcpy(ah->grh.dgid.raw, dgid, 16);
}

static inline int weft_qp_rtr(struct ibv_qp *qp, int ud, uint8_t port, int sgid, const uint8_t *dgid, uint16_t dlid,
		int mtu, uint32_t dqpn, uint32_t rq_psn, uint8_t max_dest_rd, uint8_t min_rnr) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	if (ud) return ibv_modify_qp(qp, &a, IBV_QP_STATE);
	a.path_mtu = mtu;
	a.dest_qp_num = dqpn;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = max_dest_rd;
	a.min_rnr_timer = min_rnr;
	weft_ah_attr(&a.ah_attr, port, sgid, dgid, dlid);
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static inline int weft_qp_rts(struct ibv_qp *qp, int ud, uint32_t sq_psn, uint8_t timeout, uint8_t retry, uint8_t rnr, uint8_t max_rd) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = sq_psn;
	if (ud) return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	a.timeout = timeout;
	a.retry_cnt = retry;
	a.rnr_retry = rnr;
	a.max_rd_atomic = max_rd;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
		IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static inline int weft_qp_err(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_ERR;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

static inline struct ibv_ah *weft_create_ah(struct ibv_pd *pd, uint8_t port, int sgid, const uint8_t *dgid, uint16_t dlid) {
	struct ibv_ah_attr a;
	weft_ah_attr(&a, port, sgid, dgid, dlid);
	return ibv_create_ah(pd, &a);
}

// weft_gid reads GID table entry idx of port: 0 and the entry, or an errno
// (ENODATA: the entry is empty).
static inline int weft_gid(struct ibv_context *ctx, uint8_t port, uint32_t idx, uint8_t *gid, uint32_t *type, uint32_t *ifindex) {
	struct ibv_gid_entry e;
	int rc = ibv_query_gid_ex(ctx, port, idx, &e, 0);
	if (rc) return rc;
	memcpy(gid, e.gid.raw, 16);
	*type = e.gid_type;
	*ifindex = e.ndev_ifindex;
	return 0;
}

// weft_port reads the attributes of a port that discovery reports.
static inline int weft_port(struct ibv_context *ctx, uint8_t port, uint32_t *state, uint32_t *active_mtu,
		uint32_t *link_layer, uint32_t *gid_tbl_len, uint32_t *lid) {
	struct ibv_port_attr a;
	int rc = ibv_query_port(ctx, port, &a);
	if (rc) return rc;
	*state = a.state;
	*active_mtu = a.active_mtu;
	*link_layer = a.link_layer;
	*gid_tbl_len = a.gid_tbl_len;
	*lid = a.lid;
	return 0;
}

// weft_nop is an empty call, to measure the cost of crossing into C.
static inline int weft_nop(struct weft_q *q) { return q != NULL; }

#endif
