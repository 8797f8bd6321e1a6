package ethernet

import "time"

// rttEst estimates the round-trip time and from it the retransmission
// timeout (Jacobson and Karels, RFC 6298): one packet at a time is
// timed, and Karn's rule discards a measurement when anything is
// retransmitted while it runs. The timeout is srtt + 4 rttvar, within
// [rtoMin, rtoMax]; before the first sample it is rtoMin. A shared queue
// under load delays acknowledgements well past rtoMin, and a timeout
// that ignores that resends whole windows that were never lost.
type rttEst struct {
	srtt, rttvar time.Duration
	timing       bool
	psn          uint32 // the timed packet
	start        int64
}

// sent notes that packet psn went out for the first time at now.
func (r *rttEst) sent(psn uint32, now int64) {
	if !r.timing {
		r.timing, r.psn, r.start = true, psn, now
	}
}

// acked takes a cumulative acknowledgement of the packets below ack.
func (r *rttEst) acked(ack uint32, now int64) {
	if !r.timing || !seqLT(r.psn, ack) {
		return
	}
	r.timing = false
	s := time.Duration(now - r.start)
	if r.srtt == 0 {
		r.srtt, r.rttvar = s, s/2
		return
	}
	d := r.srtt - s
	if d < 0 {
		d = -d
	}
	r.rttvar = (3*r.rttvar + d) / 4
	r.srtt = (7*r.srtt + s) / 8
}

// retransmitted applies Karn's rule.
func (r *rttEst) retransmitted() { r.timing = false }

// rto returns the retransmission timeout.
func (r *rttEst) rto() time.Duration {
	if r.srtt == 0 {
		return rtoMin
	}
	return min(max(r.srtt+4*r.rttvar, rtoMin), rtoMax)
}
