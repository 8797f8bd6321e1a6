package observe

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// MaxWait bounds the wait parameter of /events.
const MaxWait = 60 * time.Second

// Handler returns the registry's HTTP handler: GET /snapshot and GET
// /events (see the package documentation). Mount it where the program
// serves its diagnostics:
//
//	http.Handle("/weft/", http.StripPrefix("/weft", reg.Handler()))
func (r *Registry) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /snapshot", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, r.Snapshot())
	})
	mux.HandleFunc("GET /events", func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		var after uint64
		if s := q.Get("after"); s != "" {
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				http.Error(w, "after: "+err.Error(), http.StatusBadRequest)
				return
			}
			after = n
		}
		var evs []Event
		if s := q.Get("wait"); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil || d < 0 {
				http.Error(w, "wait: want a duration such as 10s", http.StatusBadRequest)
				return
			}
			ctx, cancel := context.WithTimeout(req.Context(), min(d, MaxWait))
			evs = r.WaitEvents(ctx, after)
			cancel()
		} else {
			evs, _ = r.Events(after)
		}
		if evs == nil {
			evs = []Event{}
		}
		writeJSON(w, evs)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	enc.Encode(v)
}
