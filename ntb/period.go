package ntb

import "time"

// Quiet polls back off: a bridge's monitor (the peer's presence) and a
// transport's watch (the peer's session state) poll for changes that are
// rare once a session is up. Each starts at its fast period, doubles it
// with every poll that found nothing new, up to its slow period, and
// drops back to the fast one on a change: an idle bridge then costs a
// wake-up per slow period, not per fast one (1,000 idle connections over
// 250 bridge sides took most of a core at 2 ms), while a change is still
// seen within the slow period: a crash as link-down within
// monitorSlow, a peer's Close as ErrPeerClosed within watchSlow (the
// documented bound is 100 ms).
const (
	monitorSlow = 32 * time.Millisecond
	watchFast   = 2 * time.Millisecond
	watchSlow   = 16 * time.Millisecond
)

// pollPeriod is the period of one backing-off poll.
type pollPeriod struct{ fast, slow, cur time.Duration }

// next returns the wait before the next poll, given whether this one
// found a change.
func (p *pollPeriod) next(changed bool) time.Duration {
	switch {
	case changed || p.cur == 0:
		p.cur = p.fast
	case p.cur < p.slow:
		p.cur = min(2*p.cur, p.slow)
	}
	return p.cur
}
