//go:build tools

// Package helm only pins the helm command the chart tests build (tests/controlplane/build.sh).
package helm

import _ "helm.sh/helm/v4/cmd/helm"
