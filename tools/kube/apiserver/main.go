// Command kube-apiserver: Kubernetes' own kube-apiserver (k8s.io/kubernetes/cmd/kube-apiserver/app), built as a
// module dependency for the discovery tests.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
