// Package measure is what Weft's measuring tools (tools/perf and
// tools/router) share: a CLOCK_MONOTONIC clock that other processes on the
// host can compare against, a latency histogram with its percentiles, CPU
// accounting, and PNG figures drawn with gonum/plot whose every panel has
// a title, axes labelled with their units and tick values, and a legend
// naming each line.
//
// The histogram keeps 32 sub-buckets per power of two (at most about 3%
// error, exact below 64 ns): the finer of the two the tools had (perf's;
// the router's kept 16, about 6%). Its quantiles are nearest-rank: the
// smallest recorded value with at least q·n samples at or below it.
//
// The package lives in the tools module, not the SDK, because its plots
// need gonum/plot, which must not enter the SDK's go.mod.
package measure
