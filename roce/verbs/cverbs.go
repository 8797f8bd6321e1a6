//go:build linux && cgo && rdma

package verbs

// The C side of the binding. Everything the data path touches lives in C
// memory allocated once per queue pair (struct weft_q): Go fills flat work
// request descriptors (struct weft_swr) and SGEs (struct ibv_sge, whose
// layout is plain) in place, and one C call links them into an
// ibv_send_wr chain and posts it with a single ibv_post_send: the post
// list, one doorbell per burst. Completions are converted by C into flat
// struct weft_wc entries that Go reads in place. No Go pointer is ever
// handed to C on these paths, so cgo's pointer checks have nothing to
// object to and nothing escapes to the heap.

/*
#cgo LDFLAGS: -libverbs -lrdmacm
#include "weft_verbs.h"
*/
import "C"
