#!/usr/bin/env bash
# softefa's own cost, as instructions (callgrind: deterministic where a
# pingpong's wall clock on a shared machine is not): one process, two SRD
# QPs on loopback, a send of SIZE bytes from one to the other and a fixed
# sequence of polls per iteration (the receiver's, which takes the send;
# the receiver's next, which acknowledges it unless that poll did; the
# sender's, which takes the completion), no progress thread.
# Prints the user-space instructions per iteration (syscalls not counted)
# for each library given, so two builds compare side by side.
#
# Usage: scripts/softefa-loop.sh [-S SIZE] [LIB...]
#   -S  the send's size in bytes (default 64; 1 KiB and up go zero-copy)
#   LIB softefa libraries (default: the release build's libsoftefa.so)
# Exit status: 0 done, 1 a run failed, 2 bad arguments.
set -euo pipefail
cd "$(dirname "$0")/.."

size=64
while getopts "S:h" opt; do
  case "$opt" in
    S) size="$OPTARG" ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
command -v valgrind >/dev/null || { echo "softefa-loop: valgrind is needed" >&2; exit 1; }
if [ "$#" -eq 0 ]; then
  cargo build --release --quiet -p softefa
  set -- "${CARGO_TARGET_DIR:-target}/release/libsoftefa.so"
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/loop.c" <<'EOF'
#include <infiniband/efadv.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
struct side { struct ibv_cq_ex *cq; struct ibv_qp *qp; struct ibv_qp_ex *qpx; };
static struct ibv_context *ctx;
static struct ibv_pd *pd;
static void make(struct side *s) {
  struct ibv_cq_init_attr_ex ca = {.cqe = 256, .wc_flags = IBV_WC_STANDARD_FLAGS};
  struct efadv_cq_init_attr ea = {0};
  s->cq = efadv_create_cq(ctx, &ca, &ea, sizeof ea);
  struct ibv_qp_init_attr_ex qa = {0};
  qa.send_cq = qa.recv_cq = ibv_cq_ex_to_cq(s->cq);
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 64;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  qa.qp_type = IBV_QPT_DRIVER;
  qa.sq_sig_all = 1;
  qa.pd = pd;
  qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  qa.send_ops_flags = IBV_QP_EX_WITH_SEND;
  struct efadv_qp_init_attr e = {.driver_qp_type = EFADV_QP_DRIVER_TYPE_SRD};
  s->qp = efadv_create_qp_ex(ctx, &qa, &e, sizeof e);
  if (!s->qp) { perror("efadv_create_qp_ex"); exit(1); }
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .qkey = 0x1234, .port_num = 1};
  ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
  a.qp_state = IBV_QPS_RTR;
  ibv_modify_qp(s->qp, &a, IBV_QP_STATE);
  a.qp_state = IBV_QPS_RTS;
  ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
  s->qpx = ibv_qp_to_qp_ex(s->qp);
}
/* One poll session: how many completions it took. */
static int poll(struct side *s) {
  struct ibv_poll_cq_attr pa = {0};
  if (ibv_start_poll(s->cq, &pa)) return 0;
  int n = 0;
  do {
    if (s->cq->status) { fprintf(stderr, "status %d\n", s->cq->status); exit(1); }
    n++;
  } while (!ibv_next_poll(s->cq));
  ibv_end_poll(s->cq);
  return n;
}
static char mem[2][1 << 16];
int main(int argc, char **argv) {
  int iters = atoi(argv[1]), size = atoi(argv[2]);
  ctx = ibv_open_device(ibv_get_device_list(NULL)[0]);
  pd = ibv_alloc_pd(ctx);
  struct ibv_mr *mr = ibv_reg_mr(pd, mem, sizeof mem, IBV_ACCESS_LOCAL_WRITE);
  struct side a, b;
  make(&a);
  make(&b);
  union ibv_gid gid;
  ibv_query_gid(ctx, 1, 0, &gid);
  struct ibv_ah_attr aa = {.is_global = 1, .grh.dgid = gid, .port_num = 1};
  struct ibv_ah *ah = ibv_create_ah(pd, &aa);
  struct ibv_sge rs = {(uintptr_t)mem[1], sizeof mem[1], mr->lkey};
  struct ibv_recv_wr rw = {.sg_list = &rs, .num_sge = 1}, *bad;
  for (int i = 0; i < 32; i++) ibv_post_recv(b.qp, &rw, &bad);
  for (int i = 0; i < iters; i++) {
    ibv_wr_start(a.qpx);
    a.qpx->wr_id = i;
    ibv_wr_send(a.qpx);
    ibv_wr_set_ud_addr(a.qpx, ah, b.qp->qp_num, 0x1234);
    ibv_wr_set_sge(a.qpx, mr->lkey, (uintptr_t)mem[0], size);
    if (ibv_wr_complete(a.qpx)) { fprintf(stderr, "ibv_wr_complete\n"); return 1; }
    while (!poll(&b)) {}
    ibv_post_recv(b.qp, &rw, &bad);
    poll(&b);
    while (!poll(&a)) poll(&b);
  }
  return 0;
}
EOF
cc -O2 -o "$tmp/loop" "$tmp/loop.c" -libverbs -lefa
count() {
  SOFTEFA_PROGRESS=0 LD_PRELOAD="$1" valgrind --tool=callgrind \
    --callgrind-out-file="$tmp/cg.out" "$tmp/loop" "$2" "$size" 2>&1 |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
for lib in "$@"; do
  # The difference of two runs: set-up and teardown cancel out.
  lo=$(count "$lib" 2000)
  hi=$(count "$lib" 4000)
  if [ -z "$lo" ] || [ -z "$hi" ]; then
    echo "softefa-loop: $lib failed" >&2
    exit 1
  fi
  echo "$lib: $(( (hi - lo) / 2000 )) instructions per $size B send (softefa's user space)"
done
