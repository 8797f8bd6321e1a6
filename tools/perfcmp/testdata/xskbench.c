// xskbench: the reference AF_XDP packet-rate loop for Weft's perfcmp, a
// plain C program on libxdp's xsk API (the same ring protocol as Weft's
// Go code: batches of 64, 2048-entry rings, 4096-byte frames, copy mode
// with need_wakeup).
//
//   xskbench rx IFNAME QUEUE SECONDS           (XSKMAP file descriptor 3)
//   xskbench tx IFNAME QUEUE SECONDS FRAMEHEX
//
// It prints "packets N ns T" on stdout. perfcmp builds it with
// gcc -O2 xskbench.c -lxdp -lbpf and runs it in a test namespace.
#include <errno.h>
#include <signal.h>
#include <unistd.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <xdp/xsk.h>

#define NUM_FRAMES 4096
#define FRAME_SIZE 4096
#define RING 2048
#define BATCH 64

static volatile sig_atomic_t stop;

static void on_signal(int sig) {
	(void)sig;
	stop = 1;
}

static unsigned long long now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (unsigned long long)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static int hexval(char c) {
	if (c >= '0' && c <= '9') return c - '0';
	if (c >= 'a' && c <= 'f') return c - 'a' + 10;
	if (c >= 'A' && c <= 'F') return c - 'A' + 10;
	return -1;
}

int main(int argc, char **argv) {
	if (argc < 5) {
		fprintf(stderr, "usage: xskbench rx|tx IFNAME QUEUE SECONDS [FRAMEHEX]\n");
		return 2;
	}
	int tx = strcmp(argv[1], "tx") == 0;
	const char *ifname = argv[2];
	int queue = atoi(argv[3]);
	double secs = atof(argv[4]);
	unsigned char frame[2048];
	int flen = 0;
	if (tx) {
		if (argc < 6) {
			fprintf(stderr, "tx needs FRAMEHEX\n");
			return 2;
		}
		const char *h = argv[5];
		for (; h[0] && h[1] && flen < (int)sizeof(frame); h += 2)
			frame[flen++] = hexval(h[0]) << 4 | hexval(h[1]);
	}

	void *area = mmap(NULL, (size_t)NUM_FRAMES * FRAME_SIZE, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (area == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	struct xsk_ring_prod fq, txr;
	struct xsk_ring_cons cq, rxr;
	struct xsk_umem *umem;
	struct xsk_umem_config ucfg = {.fill_size = RING, .comp_size = RING,
		.frame_size = FRAME_SIZE, .frame_headroom = 0, .flags = 0};
	int err = xsk_umem__create(&umem, area, (__u64)NUM_FRAMES * FRAME_SIZE, &fq, &cq, &ucfg);
	if (err) {
		fprintf(stderr, "xsk_umem__create: %s\n", strerror(-err));
		return 1;
	}
	struct xsk_socket_config scfg = {
		.rx_size = tx ? 0 : RING,
		.tx_size = tx ? RING : 0,
		.libxdp_flags = XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD,
		.xdp_flags = 0,
		.bind_flags = XDP_COPY | XDP_USE_NEED_WAKEUP,
	};
	struct xsk_socket *xsk;
	signal(SIGINT, on_signal);
	/* A queue released a moment ago can still be busy: the kernel frees
	 * it in a deferred work item. */
	for (int try = 0;; try++) {
		err = xsk_socket__create(&xsk, ifname, queue, umem, tx ? NULL : &rxr, tx ? &txr : NULL, &scfg);
		if (err != -EBUSY || try >= 200)
			break;
		usleep(10000);
	}
	if (err) {
		fprintf(stderr, "xsk_socket__create: %s\n", strerror(-err));
		return 1;
	}
	int fd = xsk_socket__fd(xsk);
	unsigned long long count = 0, start, end;
	unsigned int idx;

	if (!tx) {
		err = xsk_socket__update_xskmap(xsk, 3);
		if (err) {
			fprintf(stderr, "xsk_socket__update_xskmap: %s\n", strerror(-err));
			return 1;
		}
		if (xsk_ring_prod__reserve(&fq, RING, &idx) != RING) {
			fprintf(stderr, "fill reserve failed\n");
			return 1;
		}
		for (int i = 0; i < RING; i++)
			*xsk_ring_prod__fill_addr(&fq, idx++) = (__u64)i * FRAME_SIZE;
		xsk_ring_prod__submit(&fq, RING);
		printf("ready\n");
		fflush(stdout);
		start = now_ns();
		end = start + (unsigned long long)(secs * 1e9);
		for (unsigned long it = 0;; it++) {
			if ((it & 63) == 0 && (stop || now_ns() >= end))
				break;
			unsigned int idx_rx, idx_fq;
			unsigned int n = xsk_ring_cons__peek(&rxr, BATCH, &idx_rx);
			if (!n) {
				if (xsk_ring_prod__needs_wakeup(&fq))
					recvfrom(fd, NULL, 0, MSG_DONTWAIT, NULL, NULL);
				continue;
			}
			while (xsk_ring_prod__reserve(&fq, n, &idx_fq) != n)
				;
			for (unsigned int i = 0; i < n; i++)
				*xsk_ring_prod__fill_addr(&fq, idx_fq++) =
					xsk_ring_cons__rx_desc(&rxr, idx_rx++)->addr;
			xsk_ring_prod__submit(&fq, n);
			xsk_ring_cons__release(&rxr, n);
			count += n;
		}
	} else {
		for (int i = 0; i < NUM_FRAMES; i++)
			memcpy((char *)area + (size_t)i * FRAME_SIZE, frame, flen);
		unsigned long long next = 0, outstanding = 0;
		printf("ready\n");
		fflush(stdout);
		start = now_ns();
		end = start + (unsigned long long)(secs * 1e9);
		for (unsigned long it = 0;; it++) {
			if ((it & 63) == 0 && (stop || now_ns() >= end))
				break;
			unsigned int idx_cq;
			unsigned int done = xsk_ring_cons__peek(&cq, RING, &idx_cq);
			if (done) {
				xsk_ring_cons__release(&cq, done);
				outstanding -= done;
				count += done;
			}
			if (outstanding + BATCH <= NUM_FRAMES &&
			    xsk_ring_prod__reserve(&txr, BATCH, &idx) == BATCH) {
				for (int i = 0; i < BATCH; i++) {
					struct xdp_desc *d = xsk_ring_prod__tx_desc(&txr, idx + i);
					d->addr = (next++ % NUM_FRAMES) * FRAME_SIZE;
					d->len = flen;
				}
				xsk_ring_prod__submit(&txr, BATCH);
				outstanding += BATCH;
			}
			if (xsk_ring_prod__needs_wakeup(&txr))
				sendto(fd, NULL, 0, MSG_DONTWAIT, NULL, 0);
		}
	}
	unsigned long long ns = now_ns() - start;
	printf("packets %llu ns %llu\n", count, ns);
	xsk_socket__delete(xsk);
	xsk_umem__delete(umem);
	return 0;
}
