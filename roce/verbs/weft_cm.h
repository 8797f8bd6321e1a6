// weft_cm.h: the librdmacm side of Weft's verbs binding (see cm_rdma.go).
// Events are copied into a flat struct and acknowledged at once, so Go
// never holds a struct rdma_cm_event; addresses cross as 16-byte
// (IPv4-mapped) arrays and ports in host order.
#ifndef WEFT_CM_H
#define WEFT_CM_H
#include "weft_verbs.h"
#include <rdma/rdma_cma.h>
#include <netinet/in.h>

struct weft_cm_ev {
	int event;
	int status;
	struct rdma_cm_id *id;
	struct rdma_cm_id *listen_id;
	uint32_t qp_num;
	uint8_t resp_res, init_depth, retry, rnr;
	uint8_t pdata_len;
	uint8_t pdata[255];
};

// weft_cm_get_event takes one event of a non-blocking channel, copies it
// into out and acknowledges it: 1 if there was one, 0 if not, -1 on error.
static inline int weft_cm_get_event(struct rdma_event_channel *ch, struct weft_cm_ev *out) {
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e)) return errno == EAGAIN ? 0 : -1;
	memset(out, 0, sizeof *out);
	out->event = e->event;
	out->status = e->status;
	out->id = e->id;
	out->listen_id = e->listen_id;
	switch (e->event) {
	case RDMA_CM_EVENT_CONNECT_REQUEST:
	case RDMA_CM_EVENT_CONNECT_RESPONSE:
	case RDMA_CM_EVENT_ESTABLISHED:
	case RDMA_CM_EVENT_REJECTED:
		break; // these carry connection parameters (RC: param.conn)
	default:
		rdma_ack_cm_event(e);
		return 1;
	}
	const struct rdma_conn_param *p = &e->param.conn;
	out->qp_num = p->qp_num;
	out->resp_res = p->responder_resources;
	out->init_depth = p->initiator_depth;
	out->retry = p->retry_count;
	out->rnr = p->rnr_retry_count;
	if (p->private_data && p->private_data_len) {
		out->pdata_len = p->private_data_len;
		memcpy(out->pdata, p->private_data, p->private_data_len);
	}
	rdma_ack_cm_event(e);
	return 1;
}

// weft_sockaddr fills sa from a 16-byte address (IPv4-mapped: AF_INET)
// and a port; it returns the length.
static inline socklen_t weft_sockaddr(struct sockaddr_storage *sa, const uint8_t *ip, uint16_t port) {
	static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	memset(sa, 0, sizeof *sa);
	if (!memcmp(ip, v4, 12)) {
		struct sockaddr_in *s = (struct sockaddr_in *)sa;
		s->sin_family = AF_INET;
		s->sin_port = htons(port);
		memcpy(&s->sin_addr, ip + 12, 4);
		return sizeof *s;
	}
	struct sockaddr_in6 *s = (struct sockaddr_in6 *)sa;
	s->sin6_family = AF_INET6;
	s->sin6_port = htons(port);
	memcpy(&s->sin6_addr, ip, 16);
	return sizeof *s;
}

// weft_cm_addr reads the local (peer == 0) or peer address of id into ip
// (16 bytes, IPv4-mapped) and port; it returns 4, 6, or 0 if unknown.
static inline int weft_cm_addr(struct rdma_cm_id *id, int peer, uint8_t *ip, uint16_t *port) {
	struct sockaddr *sa = peer ? rdma_get_peer_addr(id) : rdma_get_local_addr(id);
	memset(ip, 0, 16);
	*port = 0;
	if (sa->sa_family == AF_INET) {
		struct sockaddr_in *s = (struct sockaddr_in *)sa;
		ip[10] = ip[11] = 0xff;
		memcpy(ip + 12, &s->sin_addr, 4);
		*port = ntohs(s->sin_port);
		return 4;
	}
	if (sa->sa_family == AF_INET6) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)sa;
		memcpy(ip, &s->sin6_addr, 16);
		*port = ntohs(s->sin6_port);
		return 6;
	}
	return 0;
}

static inline int weft_cm_resolve_addr(struct rdma_cm_id *id, int has_src, const uint8_t *src, const uint8_t *dst,
		uint16_t port, int timeout_ms) {
	struct sockaddr_storage s, d;
	weft_sockaddr(&s, src, 0);
	weft_sockaddr(&d, dst, port);
	return rdma_resolve_addr(id, has_src ? (struct sockaddr *)&s : NULL, (struct sockaddr *)&d, timeout_ms);
}

static inline int weft_cm_bind(struct rdma_cm_id *id, const uint8_t *ip, uint16_t port) {
	struct sockaddr_storage s;
	weft_sockaddr(&s, ip, port);
	return rdma_bind_addr(id, (struct sockaddr *)&s);
}

static inline int weft_cm_ack_timeout(struct rdma_cm_id *id, uint8_t timeout) {
	return rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, sizeof timeout);
}

// weft_cm_create_qp creates id's RC queue pair on pd with the given CQs;
// librdmacm moves it through its states from then on.
static inline struct ibv_qp *weft_cm_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *scq,
		struct ibv_cq *rcq, uint32_t max_send_wr, uint32_t max_recv_wr, uint32_t max_sge, uint32_t max_inline,
		uint32_t *got_inline, uint32_t *got_send_wr) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 0;
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_recv_wr = max_recv_wr;
	a.cap.max_send_sge = max_sge;
	a.cap.max_recv_sge = 1;
	a.cap.max_inline_data = max_inline;
	if (rdma_create_qp(id, pd, &a)) return NULL;
	*got_inline = a.cap.max_inline_data;
	*got_send_wr = a.cap.max_send_wr;
	return id->qp;
}

static inline int weft_cm_connect(struct rdma_cm_id *id, const void *pdata, uint8_t len, uint8_t rr, uint8_t depth,
		uint8_t retry, uint8_t rnr) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof p);
	p.private_data = len ? pdata : NULL;
	p.private_data_len = len;
	p.responder_resources = rr;
	p.initiator_depth = depth;
	p.retry_count = retry;
	p.rnr_retry_count = rnr;
	return rdma_connect(id, &p);
}

static inline int weft_cm_accept(struct rdma_cm_id *id, const void *pdata, uint8_t len, uint8_t rr, uint8_t depth,
		uint8_t rnr) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof p);
	p.private_data = len ? pdata : NULL;
	p.private_data_len = len;
	p.responder_resources = rr;
	p.initiator_depth = depth;
	p.rnr_retry_count = rnr;
	return rdma_accept(id, &p);
}

// weft_qp_path_mtu returns the queue pair's path MTU (enum ibv_mtu), or 0.
static inline int weft_qp_path_mtu(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(qp, &a, IBV_QP_PATH_MTU, &ia)) return 0;
	return a.path_mtu;
}
#endif
