// Package prom serves the sources of an observe.Registry as Prometheus
// metrics, through github.com/prometheus/client_golang.
//
// It is a module of its own (github.com/weft-io/weft/observe/prom) so
// that the SDK's go.mod does not carry client_golang and what it
// pulls in (client_model, common, procfs, protobuf, ...) for every
// program that imports Weft: the routers and message layers that use
// the SDK mostly do not run Prometheus, and a go.mod requirement is
// paid by every importer's module graph. Programs that want metrics add
// this module; the JSON snapshot and event API that `weft status` and
// `weft watch` read is in observe itself and needs nothing.
//
// Each counter of a source becomes weft_KIND_NAME_total (a gauge:
// weft_KIND_NAME) with the labels source, backend; each source also
// has weft_up (1 while its state is "up"), and the registry
// weft_events_total.
package prom

import (
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weft-io/weft/observe"
)

// Collector is a prometheus.Collector over a registry's sources. It is
// unchecked (Describe sends nothing): sources come and go.
type Collector struct {
	r     *observe.Registry
	mu    sync.Mutex
	descs map[string]*prometheus.Desc
}

// NewCollector returns a collector over r.
func NewCollector(r *observe.Registry) *Collector {
	return &Collector{r: r, descs: map[string]*prometheus.Desc{}}
}

// Describe implements prometheus.Collector (unchecked: it sends nothing).
func (c *Collector) Describe(chan<- *prometheus.Desc) {}

var labels = []string{"source", "backend"}

func (c *Collector) desc(name, help string, l []string) *prometheus.Desc {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.descs[name]
	if d == nil {
		d = prometheus.NewDesc(name, help, l, nil)
		c.descs[name] = d
	}
	return d
}

// Collect implements prometheus.Collector: one snapshot of the registry.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.r.Snapshot()
	for _, src := range s.Sources {
		up := 0.0
		if src.State == "up" {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(c.desc("weft_up", "1 while the source's state is up", labels),
			prometheus.GaugeValue, up, src.Name, src.Backend)
		for _, k := range src.Counters {
			name, typ := "weft_"+src.Kind+"_"+k.Name, prometheus.GaugeValue
			if !k.Gauge {
				name, typ = name+"_total", prometheus.CounterValue
			}
			help := k.Help
			if help == "" {
				help = k.Name
			}
			m, err := prometheus.NewConstMetric(c.desc(name, help, labels), typ, float64(k.Value), src.Name, src.Backend)
			if err != nil {
				ch <- prometheus.NewInvalidMetric(c.desc(name, help, labels), err)
				continue
			}
			ch <- m
		}
	}
	var seq uint64
	if n := len(s.Events); n > 0 {
		seq = s.Events[n-1].Seq
	}
	ch <- prometheus.MustNewConstMetric(c.desc("weft_events_total", "events recorded", nil), prometheus.CounterValue, float64(seq))
}

// Handler returns an HTTP handler that serves r's metrics in the
// Prometheus text format (or OpenMetrics, as the scraper asks):
//
//	http.Handle("/metrics", prom.Handler(reg))
func Handler(r *observe.Registry) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(r))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}
