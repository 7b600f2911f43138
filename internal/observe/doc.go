// Package observe turns the proxy's read-only statistics into what operators
// read: the Prometheus collector evaluated at scrape time, the stats_period
// averages of SHOW STATS and the periodic stats log line, and the /stats
// health report.
//
// It only reads: every value comes from a Source (a *proxy.Server), whose
// methods return copies, so observe holds no lock of the proxy's and costs
// the relay nothing between scrapes. It does not count anything on the
// relay's path; the counters and the histograms observed inline (checkout
// wait, query and transaction durations, rate-limit decisions) stay in
// internal/proxy (instruments.go), which registers them with
// proxy.Server.Instrument. It serves nothing over HTTP either: internal/health
// does, with the Gatherer and the report function main gives it.
package observe
