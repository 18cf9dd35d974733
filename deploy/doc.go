// Package deploy holds the tests of the operator's files beside it: the
// Grafana dashboard (grafana/sandbot.json) and the Prometheus alerting rules
// (prometheus/alerts.yml) name only metrics and labels that a running
// server exports, every alert has a runbook line, and promtool accepts the
// rules, their unit tests and the dashboard's queries (ops_test.go).
package deploy
