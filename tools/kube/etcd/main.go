// Command etcd: etcd's own server main (go.etcd.io/etcd/server/v3/etcdmain), built as a module dependency.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
