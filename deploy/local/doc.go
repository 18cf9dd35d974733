// Package local holds the process-level test of the replicas topology
// (replicas_test.go, build tag "replicas"): run.sh starts a PostgreSQL
// cluster of its own, three sandbot replicas and HAProxy, and runs the test
// against them (`deploy/local/run.sh test`, which `make test` calls).
package local
