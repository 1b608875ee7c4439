/* A verbs program as EFA users write them (libibverbs + efadv), run under
 * softefa (LD_PRELOAD): device and port queries, PD, MRs, extended CQs
 * with the sender GID, SRD QPs through efadv, the ibv_wr_* builder, the
 * old post/poll API, AHs, sends and RDMA writes with immediate data (a
 * receive in posting order takes each), RDMA read and write, and
 * EFA's quirks: RDMA read completes as a send, an unknown sender has slid
 * 0xffff and its GID, SQ full fails the whole batch, unsignaled WRs and
 * too many receive SGEs are refused.
 *
 * Prints "ok <what>" per check; exits 1 at the first failure. */
#include <errno.h>
#include <infiniband/efadv.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, \
				#cond);                                        \
			fprintf(stderr, __VA_ARGS__);                          \
			fprintf(stderr, "\n");                                 \
			exit(1);                                               \
		}                                                              \
	} while (0)

#define OK(what) printf("ok %s\n", what)

#define LEN (64 * 1024)
#define WR_FLAGS                                                               \
	(IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | \
	 IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID)

struct wc {
	uint64_t wr_id;
	int status;
	uint32_t vendor_err, opcode, byte_len, imm, flags, qp_num, src_qp, slid;
	int sgid_rc;
	union ibv_gid sgid;
};

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq_ex *cq;
	struct efadv_cq *dv;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	struct ibv_mr *mr;
	uint8_t *buf;
	uint32_t qkey;
	struct ibv_ah *ah; /* to the (one) GID of this host */
	struct wc held[64]; /* polled while waiting on the other side */
	int nheld;
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Polls one completion off the CQ of `s`, if any. */
static int poll_cq1(struct side *s, struct wc *w)
{
	struct ibv_poll_cq_attr attr = {0};
	int rc = ibv_start_poll(s->cq, &attr);
	if (rc == ENOENT)
		return 0;
	CHECK(rc == 0, "start_poll %d", rc);
	w->wr_id = s->cq->wr_id;
	w->status = s->cq->status;
	w->vendor_err = ibv_wc_read_vendor_err(s->cq);
	w->opcode = ibv_wc_read_opcode(s->cq);
	w->byte_len = ibv_wc_read_byte_len(s->cq);
	w->flags = ibv_wc_read_wc_flags(s->cq);
	w->imm = (w->flags & IBV_WC_WITH_IMM) ? ibv_wc_read_imm_data(s->cq) : 0;
	w->qp_num = ibv_wc_read_qp_num(s->cq);
	w->src_qp = ibv_wc_read_src_qp(s->cq);
	w->slid = ibv_wc_read_slid(s->cq);
	w->sgid_rc = efadv_wc_read_sgid(s->dv, &w->sgid);
	ibv_end_poll(s->cq);
	return 1;
}

/* The next completion of `s`: one kept earlier, or one polled now. */
static int poll1(struct side *s, struct wc *w)
{
	if (s->nheld) {
		*w = s->held[0];
		memmove(s->held, s->held + 1, --s->nheld * sizeof(*w));
		return 1;
	}
	return poll_cq1(s, w);
}

/* Polls both sides until a completion comes on `s`: each side's progress
 * (acknowledgements, serving a peer's read) happens only when it is
 * polled, as a NIC's would without a host. The other's completions are
 * kept for later. */
static struct wc wait_wc(struct side *s, struct side *other)
{
	struct wc w, x;
	double end = now() + 10;
	for (;;) {
		CHECK(now() < end, "no completion within 10 s");
		if (poll1(s, &w))
			return w;
		if (poll_cq1(other, &x)) {
			CHECK(other->nheld < 64, "too many held");
			other->held[other->nheld++] = x;
		}
	}
}

/* Polls both for `secs`, expecting nothing. */
static void expect_quiet(struct side *a, struct side *b, double secs)
{
	struct wc w;
	double end = now() + secs;
	while (now() < end) {
		CHECK(!poll1(a, &w), "unexpected completion wr_id %lu", (unsigned long)w.wr_id);
		CHECK(!poll1(b, &w), "unexpected completion wr_id %lu", (unsigned long)w.wr_id);
	}
}

static struct ibv_qp *make_qp(struct side *s, uint32_t max_send_wr, int sig_all)
{
	struct ibv_qp_init_attr_ex a = {0};
	struct efadv_qp_init_attr e = {0};
	a.send_cq = ibv_cq_ex_to_cq(s->cq);
	a.recv_cq = ibv_cq_ex_to_cq(s->cq);
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_recv_wr = 64;
	a.cap.max_send_sge = 2;
	a.cap.max_recv_sge = 1;
	a.cap.max_inline_data = 32;
	a.qp_type = IBV_QPT_DRIVER;
	a.sq_sig_all = sig_all;
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	a.pd = s->pd;
	a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
			   IBV_QP_EX_WITH_RDMA_READ |
			   IBV_QP_EX_WITH_RDMA_WRITE |
			   IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
	e.driver_qp_type = EFADV_QP_DRIVER_TYPE_SRD;
	struct ibv_qp *qp = efadv_create_qp_ex(s->ctx, &a, &e, sizeof(e));
	CHECK(qp, "efadv_create_qp_ex: %s", strerror(errno));
	CHECK(a.cap.max_send_wr >= max_send_wr, "cap written back");

	struct ibv_qp_attr m = {0};
	m.qp_state = IBV_QPS_INIT;
	m.pkey_index = 0;
	m.port_num = 1;
	m.qkey = s->qkey;
	CHECK(ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0,
	      "INIT");
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(qp, &m, IBV_QP_STATE) == 0, "RTR");
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_RTS;
	m.sq_psn = 0;
	m.rnr_retry = 7;
	CHECK(ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RNR_RETRY) == 0, "RTS");
	return qp;
}

static void open_side(struct side *s, uint32_t qkey)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 1, "one device, got %d", n);
	s->ctx = ibv_open_device(list[0]);
	CHECK(s->ctx, "open");
	ibv_free_device_list(list);
	s->pd = ibv_alloc_pd(s->ctx);
	CHECK(s->pd, "pd");
	s->buf = aligned_alloc(4096, LEN);
	memset(s->buf, 0, LEN);
	s->mr = ibv_reg_mr(s->pd, s->buf, LEN,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
	CHECK(s->mr, "reg_mr: %s", strerror(errno));
	CHECK(s->mr->lkey == s->mr->rkey, "one key");

	struct ibv_cq_init_attr_ex ca = {0};
	struct efadv_cq_init_attr ea = {0};
	ca.cqe = 256;
	ca.wc_flags = WR_FLAGS;
	ea.wc_flags = EFADV_WC_EX_WITH_SGID;
	s->cq = efadv_create_cq(s->ctx, &ca, &ea, sizeof(ea));
	CHECK(s->cq, "efadv_create_cq: %s", strerror(errno));
	s->dv = efadv_cq_from_ibv_cq_ex(s->cq);
	CHECK(s->dv, "efadv cq");
	s->qkey = qkey;
	s->qp = make_qp(s, 256, 1);
	s->qpx = ibv_qp_to_qp_ex(s->qp);
	CHECK(s->qpx, "qp_ex");
}

static struct ibv_ah *make_ah(struct side *s)
{
	union ibv_gid gid;
	CHECK(ibv_query_gid(s->ctx, 1, 0, &gid) == 0, "gid");
	struct ibv_ah_attr a = {0};
	a.is_global = 1;
	a.grh.dgid = gid;
	a.port_num = 1;
	struct ibv_ah *ah = ibv_create_ah(s->pd, &a);
	CHECK(ah, "ah");
	return ah;
}

static void post_recv(struct side *s, uint64_t wr_id, uint32_t off, uint32_t len)
{
	struct ibv_sge sge = {(uintptr_t)(s->buf + off), len, s->mr->lkey};
	struct ibv_recv_wr wr = {0}, *bad = NULL;
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0, "post_recv");
}

/* A batch of `n` one-byte inline sends from `qx` to b's QP. */
static int inline_batch(struct ibv_qp_ex *qx, struct side *a, struct side *b, int n,
			uint64_t wr_id, unsigned flags)
{
	ibv_wr_start(qx);
	for (int i = 0; i < n; i++) {
		qx->wr_id = wr_id + i;
		qx->wr_flags = flags;
		ibv_wr_send(qx);
		ibv_wr_set_ud_addr(qx, a->ah, b->qp->qp_num, b->qkey);
		ibv_wr_set_inline_data(qx, "x", 1);
	}
	return ibv_wr_complete(qx);
}

static void fill(uint8_t *p, size_t n, int seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 31 + seed * 7 + 1);
}

int main(void)
{
	struct side a = {0}, b = {0};

	/* The device, as EFA reports it. */
	{
		int n = 0;
		struct ibv_device **list = ibv_get_device_list(&n);
		CHECK(n == 1 && list[1] == NULL, "n %d", n);
		CHECK(strcmp(ibv_get_device_name(list[0]), "rdmap0s0") == 0, "name %s",
		      ibv_get_device_name(list[0]));
		CHECK(list[0]->node_type == IBV_NODE_UNSPECIFIED, "node type");
		CHECK(list[0]->transport_type == IBV_TRANSPORT_UNSPECIFIED, "transport");
		ibv_free_device_list(list);
		OK("device list");
	}
	open_side(&a, 0x11111111);
	open_side(&b, 0x22222222);
	{
		struct ibv_device_attr d;
		CHECK(ibv_query_device(a.ctx, &d) == 0, "query_device");
		CHECK(d.vendor_id == 0x1d0f && d.vendor_part_id == 0xefa1, "vendor %x %x",
		      d.vendor_id, d.vendor_part_id);
		CHECK(d.max_sge == 2 && d.max_sge_rd == 1 && d.phys_port_cnt == 1, "sges");
		struct ibv_port_attr p;
		CHECK(ibv_query_port(a.ctx, 1, &p) == 0, "query_port");
		CHECK(p.lid == 0 && p.state == IBV_PORT_ACTIVE && p.link_layer == IBV_LINK_LAYER_UNSPECIFIED,
		      "port");
		CHECK(p.max_msg_sz == (uint32_t)(getenv("SOFTEFA_MTU") ? atoi(getenv("SOFTEFA_MTU")) : 8192),
		      "max_msg_sz %u", p.max_msg_sz);
		union ibv_gid g;
		CHECK(ibv_query_gid(a.ctx, 1, 0, &g) == 0, "gid");
		static const uint8_t lo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
		CHECK(memcmp(g.raw, lo, 16) == 0, "gid is ::ffff:127.0.0.1");
		struct efadv_device_attr e;
		CHECK(efadv_query_device(a.ctx, &e, sizeof(e)) == 0, "efadv_query_device");
		CHECK(e.max_sq_sge == 2 && e.max_rq_sge == 1 && e.inline_buf_size == 32, "efadv sges");
		CHECK(e.max_rdma_size == 1u << 30, "max_rdma_size");
		uint32_t want = EFADV_DEVICE_ATTR_CAPS_RDMA_READ | EFADV_DEVICE_ATTR_CAPS_RNR_RETRY |
				EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID;
		CHECK((e.device_caps & want) == want, "caps %x", e.device_caps);
		OK("queries");
	}
	union ibv_gid gid;
	ibv_query_gid(a.ctx, 1, 0, &gid);

	/* A send from a, whose GID b has no AH for: an unknown sender. */
	a.ah = make_ah(&a);
	for (int i = 0; i < 8; i++)
		post_recv(&b, 100 + i, i * 8192, 8192);
	fill(a.buf, 1000, 1);
	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 1;
	a.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(a.qpx);
	ibv_wr_set_ud_addr(a.qpx, a.ah, b.qp->qp_num, b.qkey);
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf, 1000);
	CHECK(ibv_wr_complete(a.qpx) == 0, "wr_complete");
	struct wc w = wait_wc(&b, &a);
	CHECK(w.status == IBV_WC_SUCCESS && w.opcode == IBV_WC_RECV && w.byte_len == 1000,
	      "recv status %d opcode %u len %u", w.status, w.opcode, w.byte_len);
	CHECK(w.wr_id >= 100 && w.wr_id < 108, "wr_id %lu", (unsigned long)w.wr_id);
	CHECK(memcmp(b.buf + (w.wr_id - 100) * 8192, a.buf, 1000) == 0, "payload");
	CHECK(w.slid == 0xffff && w.src_qp == a.qp->qp_num, "unknown sender: slid %x src_qp %u",
	      w.slid, w.src_qp);
	CHECK(w.sgid_rc == 0 && memcmp(w.sgid.raw, gid.raw, 16) == 0, "sgid rc %d", w.sgid_rc);
	CHECK(w.qp_num == b.qp->qp_num, "qp_num");
	w = wait_wc(&a, &b);
	CHECK(w.wr_id == 1 && w.status == IBV_WC_SUCCESS && w.opcode == IBV_WC_SEND, "send done");
	OK("send, unknown sender with sgid");

	/* Once b has an AH for a's GID, a is known: slid is the AH number. */
	b.ah = make_ah(&b);
	struct efadv_ah_attr aa;
	CHECK(efadv_query_ah(b.ah, &aa, sizeof(aa)) == 0, "query_ah");
	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 2;
	a.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(a.qpx);
	ibv_wr_set_ud_addr(a.qpx, a.ah, b.qp->qp_num, b.qkey);
	ibv_wr_set_inline_data(a.qpx, "inline!", 7);
	CHECK(ibv_wr_complete(a.qpx) == 0, "wr_complete");
	w = wait_wc(&b, &a);
	CHECK(w.byte_len == 7 && memcmp(b.buf + (w.wr_id - 100) * 8192, "inline!", 7) == 0, "inline");
	CHECK(w.slid == aa.ahn && w.src_qp == a.qp->qp_num, "known: slid %u ahn %u", w.slid, aa.ahn);
	CHECK(w.sgid_rc != 0, "no sgid for a known sender");
	w = wait_wc(&a, &b);
	CHECK(w.wr_id == 2 && w.status == IBV_WC_SUCCESS, "inline send done");
	OK("known sender by AH number");

	/* Two SGEs gather into one message; ibv_post_send and ibv_poll_cq. */
	{
		fill(a.buf + 4096, 300, 2);
		fill(a.buf + 8192, 200, 3);
		struct ibv_sge sg[2] = {{(uintptr_t)a.buf + 4096, 300, a.mr->lkey},
					{(uintptr_t)a.buf + 8192, 200, a.mr->lkey}};
		struct ibv_send_wr wr = {0}, *bad = NULL;
		wr.wr_id = 3;
		wr.sg_list = sg;
		wr.num_sge = 2;
		wr.opcode = IBV_WR_SEND;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.ud.ah = a.ah;
		wr.wr.ud.remote_qpn = b.qp->qp_num;
		wr.wr.ud.remote_qkey = b.qkey;
		CHECK(ibv_post_send(a.qp, &wr, &bad) == 0, "post_send");
		struct ibv_wc wc[4];
		double end = now() + 10;
		int got_b = 0, got_a = 0;
		while (!(got_a && got_b)) {
			CHECK(now() < end, "old api timeout");
			int k = ibv_poll_cq(ibv_cq_ex_to_cq(b.cq), 4, wc);
			for (int i = 0; i < k; i++) {
				CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].byte_len == 500, "old recv");
				uint8_t *p = b.buf + (wc[i].wr_id - 100) * 8192;
				CHECK(memcmp(p, a.buf + 4096, 300) == 0 && memcmp(p + 300, a.buf + 8192, 200) == 0,
				      "gathered");
				got_b = 1;
			}
			k = ibv_poll_cq(ibv_cq_ex_to_cq(a.cq), 4, wc);
			for (int i = 0; i < k; i++) {
				CHECK(wc[i].wr_id == 3 && wc[i].status == IBV_WC_SUCCESS &&
					      wc[i].opcode == IBV_WC_SEND,
				      "old send");
				got_a = 1;
			}
		}
		OK("post_send with two SGEs, poll_cq");
	}

	/* RDMA write with immediate: b sees it as a receive with the immediate. */
	fill(a.buf + 16384, 20000, 4);
	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 4;
	a.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write_imm(a.qpx, b.mr->rkey, (uintptr_t)b.buf + 32768, htobe32(0xabcd1234));
	ibv_wr_set_ud_addr(a.qpx, a.ah, b.qp->qp_num, b.qkey);
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf + 16384, 20000);
	CHECK(ibv_wr_complete(a.qpx) == 0, "write");
	w = wait_wc(&b, &a);
	CHECK(w.opcode == IBV_WC_RECV_RDMA_WITH_IMM && (w.flags & IBV_WC_WITH_IMM) &&
		      w.imm == htobe32(0xabcd1234) && w.byte_len == 20000,
	      "write imm: opcode %u imm %x len %u", w.opcode, w.imm, w.byte_len);
	CHECK(memcmp(b.buf + 32768, a.buf + 16384, 20000) == 0, "written");
	w = wait_wc(&a, &b);
	CHECK(w.wr_id == 4 && w.status == IBV_WC_SUCCESS && w.opcode == IBV_WC_RDMA_WRITE, "write done %u",
	      w.opcode);
	OK("rdma write with immediate");

	/* Send with immediate: a receive flagged with it, the value as given;
	 * it takes the next receive posted (b's fifth). */
	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 44;
	a.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(a.qpx, htobe32(0x5e4d1234));
	ibv_wr_set_ud_addr(a.qpx, a.ah, b.qp->qp_num, b.qkey);
	ibv_wr_set_inline_data(a.qpx, "imm!", 4);
	CHECK(ibv_wr_complete(a.qpx) == 0, "send imm");
	w = wait_wc(&b, &a);
	CHECK(w.status == IBV_WC_SUCCESS && w.opcode == IBV_WC_RECV && (w.flags & IBV_WC_WITH_IMM) &&
		      w.imm == htobe32(0x5e4d1234) && w.byte_len == 4 && w.wr_id == 104,
	      "send imm: opcode %u flags %x imm %x len %u wr_id %lu", w.opcode, w.flags, w.imm,
	      w.byte_len, (unsigned long)w.wr_id);
	CHECK(memcmp(b.buf + 4 * 8192, "imm!", 4) == 0, "send imm payload");
	w = wait_wc(&a, &b);
	CHECK(w.wr_id == 44 && w.status == IBV_WC_SUCCESS && w.opcode == IBV_WC_SEND, "send imm done");
	OK("send with immediate");

	/* RDMA read: its completion carries the send opcode, as on EFA. */
	fill(b.buf + 40000, 12345, 5);
	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 5;
	a.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(a.qpx, b.mr->rkey, (uintptr_t)b.buf + 40000);
	ibv_wr_set_ud_addr(a.qpx, a.ah, b.qp->qp_num, b.qkey);
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf + 50000, 12345);
	CHECK(ibv_wr_complete(a.qpx) == 0, "read");
	w = wait_wc(&a, &b);
	CHECK(w.wr_id == 5 && w.status == IBV_WC_SUCCESS && w.opcode == IBV_WC_SEND, "read done opcode %u",
	      w.opcode);
	CHECK(memcmp(a.buf + 50000, b.buf + 40000, 12345) == 0, "read data");
	OK("rdma read completes with IBV_WC_SEND");

	/* A read under a wrong rkey: EFA's bad-address vendor error. */
	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 6;
	a.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(a.qpx, b.mr->rkey ^ 0x5a5a, (uintptr_t)b.buf);
	ibv_wr_set_ud_addr(a.qpx, a.ah, b.qp->qp_num, b.qkey);
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf, 64);
	CHECK(ibv_wr_complete(a.qpx) == 0, "bad read posted");
	w = wait_wc(&a, &b);
	CHECK(w.wr_id == 6 && w.status == IBV_WC_REM_ACCESS_ERR && w.vendor_err == 7,
	      "bad rkey: status %d vendor %u", w.status, w.vendor_err);
	OK("bad rkey: vendor error 7");

	/* A local SGE under a wrong lkey: completed in error, not posted. */
	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 7;
	a.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(a.qpx);
	ibv_wr_set_ud_addr(a.qpx, a.ah, b.qp->qp_num, b.qkey);
	ibv_wr_set_sge(a.qpx, a.mr->lkey + 1, (uintptr_t)a.buf, 64);
	CHECK(ibv_wr_complete(a.qpx) == 0, "bad lkey posted");
	w = wait_wc(&a, &b);
	CHECK(w.wr_id == 7 && w.status == IBV_WC_LOC_PROT_ERR && w.vendor_err == 5, "bad lkey %d %u",
	      w.status, w.vendor_err);
	OK("bad lkey: vendor error 5");

	/* SQ full: a session of more WRs than the SQ holds fails whole. */
	{
		struct ibv_qp *small = make_qp(&a, 4, 0);
		struct ibv_qp_ex *sx = ibv_qp_to_qp_ex(small);
		int rc = inline_batch(sx, &a, &b, 5, 1000, IBV_SEND_SIGNALED);
		CHECK(rc == ENOMEM, "sq full: %d", rc);
		expect_quiet(&a, &b, 0.2);
		OK("SQ full: ENOMEM, the batch rolled back");

		/* Unsignaled on a QP that is not sq_sig_all: refused. */
		rc = inline_batch(sx, &a, &b, 1, 2000, 0);
		CHECK(rc == EINVAL, "unsignaled: %d", rc);
		expect_quiet(&a, &b, 0.1);
		OK("unsignaled WR refused");

		/* A full SQ's worth goes. */
		CHECK(inline_batch(sx, &a, &b, 4, 3000, IBV_SEND_SIGNALED) == 0, "4 of 4");
		int sent = 0, recvd = 0;
		double end = now() + 10;
		while (sent < 4 || recvd < 4) {
			CHECK(now() < end, "sent %d recvd %d", sent, recvd);
			struct wc x;
			if (poll1(&a, &x)) {
				CHECK(x.wr_id >= 3000 && x.wr_id < 3004 && x.status == 0, "small sq %lu",
				      (unsigned long)x.wr_id);
				sent++;
			}
			if (poll1(&b, &x)) {
				CHECK(x.byte_len == 1 && x.src_qp == small->qp_num, "from the small qp");
				recvd++;
				post_recv(&b, x.wr_id, (x.wr_id - 100) * 8192, 8192);
			}
		}
		CHECK(ibv_destroy_qp(small) == 0, "destroy small");
		OK("a full SQ's worth");
	}

	/* Receive SGE limit: one SGE per receive. */
	{
		struct ibv_sge sg[2] = {{(uintptr_t)b.buf, 64, b.mr->lkey},
					{(uintptr_t)b.buf + 64, 64, b.mr->lkey}};
		struct ibv_recv_wr wr = {0}, *bad = NULL;
		wr.wr_id = 9;
		wr.sg_list = sg;
		wr.num_sge = 2;
		CHECK(ibv_post_recv(b.qp, &wr, &bad) == EINVAL && bad == &wr, "two receive SGEs");
		OK("receive SGE limit");
	}

	CHECK(ibv_destroy_qp(a.qp) == 0 && ibv_destroy_qp(b.qp) == 0, "destroy qp");
	CHECK(ibv_destroy_ah(a.ah) == 0 && ibv_destroy_ah(b.ah) == 0, "destroy ah");
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(a.cq)) == 0, "destroy cq");
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(b.cq)) == 0, "destroy cq");
	CHECK(ibv_dereg_mr(a.mr) == 0 && ibv_dereg_mr(b.mr) == 0, "dereg");
	CHECK(ibv_dealloc_pd(a.pd) == 0 && ibv_dealloc_pd(b.pd) == 0, "dealloc");
	CHECK(ibv_close_device(a.ctx) == 0 && ibv_close_device(b.ctx) == 0, "close");
	OK("teardown");
	printf("all passed\n");
	return 0;
}
