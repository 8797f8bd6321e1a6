package fabric

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// Driver opens endpoints of one backend. Backend packages register a
// Driver in their init function, like database/sql drivers, so importing
// the package (for example `import _ "github.com/weft-io/weft/ntb"`)
// makes its name available to Open.
type Driver interface {
	// Open connects to addr, a backend-specific address string of the kind
	// a user types into a flag. It blocks until the connection is up or
	// ctx is done.
	Open(ctx context.Context, addr string, opts Options) (Endpoint, error)
	// Usage describes the address syntax in one line, for flag help.
	Usage() string
}

var (
	driversMu sync.RWMutex
	drivers   = map[string]Driver{}
)

// RegisterBackend makes a backend available by name. It panics if name is
// registered twice or d is nil, since both are programming errors found at
// init time.
func RegisterBackend(name string, d Driver) {
	driversMu.Lock()
	defer driversMu.Unlock()
	if d == nil {
		panic("fabric: RegisterBackend driver is nil")
	}
	if _, dup := drivers[name]; dup {
		panic("fabric: RegisterBackend called twice for " + name)
	}
	drivers[name] = d
}

// Backends returns the sorted names of the registered backends.
func Backends() []string {
	driversMu.RLock()
	defer driversMu.RUnlock()
	names := make([]string, 0, len(drivers))
	for n := range drivers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Usage returns the address syntax of a registered backend.
func Usage(backend string) (string, error) {
	driversMu.RLock()
	d, ok := drivers[backend]
	driversMu.RUnlock()
	if !ok {
		return "", fmt.Errorf("%w %q (registered: %v)", ErrUnknownBackend, backend, Backends())
	}
	return d.Usage(), nil
}

// Open opens an endpoint of the named backend at addr. opts may be nil.
// When it fails, the Endpoint is nil. An address that cannot be valid
// (a malformed or unknown parameter, a port out of range, a NUL byte, an
// interface that does not exist) fails at once with an error that
// matches ErrInvalid and names the parameter, or the part of the address
// at fault.
func Open(ctx context.Context, backend, addr string, opts *Options) (Endpoint, error) {
	d, err := driver("open", backend, addr)
	if err != nil {
		return nil, err
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	ep, err := d.Open(ctx, addr, o)
	if err != nil {
		// A driver that returns a nil pointer of its own type would hand
		// the caller a non-nil Endpoint whose Close panics.
		ep = nil
	}
	return ep, err
}
