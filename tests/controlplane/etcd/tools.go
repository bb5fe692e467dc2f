//go:build tools

// Package etcd only pins the etcd server the test harness builds.
package etcd

import _ "go.etcd.io/etcd/server/v3"
