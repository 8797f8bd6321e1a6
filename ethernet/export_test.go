package ethernet

// SetDropEvery makes the endpoint discard every n-th data packet it
// receives (0: none), to exercise loss recovery.
func SetDropEvery(e *Endpoint, n int) {
	e.mu.Lock()
	e.dropEvery = n
	e.mu.Unlock()
}
