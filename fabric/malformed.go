package fabric

// MalformedError is the error of a parsing function for input that
// failed validation: it says where (the layer and the kind of input) and
// what (the check that failed), and it matches ErrMalformed with
// errors.Is. The type is comparable; parsers keep one preallocated value
// per check, so rejecting a flood of bad input allocates nothing, and
// callers read Where, What and Code with errors.As.
type MalformedError struct {
	// Where names the layer and the input, such as "roce/wire packet",
	// "roce/cm MAD", "batch" or "ethernet handshake".
	Where string
	// What says which check failed.
	What string
	// Code is the layer's number for the check, for counting drops by
	// cause (a roce/wire.Reason, a roce/cm.Reason), or 0 where the layer
	// numbers none.
	Code int
}

// Error returns "malformed " + Where + ": " + What.
func (e *MalformedError) Error() string { return "malformed " + e.Where + ": " + e.What }

// Unwrap returns ErrMalformed.
func (e *MalformedError) Unwrap() error { return ErrMalformed }

// MalformedSet is the errors a layer returns for malformed input,
// preallocated, one per check: s[c] has Code c. A parser returns s[c], so
// rejecting input allocates nothing, and a counter of drops by cause
// indexes by Code.
type MalformedSet []*MalformedError

// NewMalformedSet returns the set of the input named where: the error of
// Code c has What whats[c]. An empty What leaves its code without an
// error (nil), as a layer does for code 0 where that means no error.
func NewMalformedSet(where string, whats ...string) MalformedSet {
	s := make(MalformedSet, len(whats))
	for c, what := range whats {
		if what != "" {
			s[c] = &MalformedError{Where: where, What: what, Code: c}
		}
	}
	return s
}

// What returns the What of the error of code, or "unknown reason" where
// the set has none.
func (s MalformedSet) What(code int) string {
	if code >= 0 && code < len(s) && s[code] != nil {
		return s[code].What
	}
	return "unknown reason"
}

// Code returns the Code of err and true if err is one of the errors of
// s itself (not wrapped, not a copy: a MalformedError of another layer
// with the same Code is not one), and 0 and false otherwise. It does not
// allocate.
func (s MalformedSet) Code(err error) (int, bool) {
	me, ok := err.(*MalformedError)
	if !ok || me == nil || me.Code < 0 || me.Code >= len(s) || s[me.Code] != me {
		return 0, false
	}
	return me.Code, true
}
