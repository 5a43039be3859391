// Command krl-control-plane is a test-only control plane in one binary: it runs either an
// etcd server or a kube-apiserver, chosen by its first argument:
//
//	krl-control-plane etcd [etcd flags...]
//	krl-control-plane kube-apiserver [kube-apiserver flags...]
//	krl-control-plane version
//
// Both are the upstream programs, linked from their Go modules
// (go.etcd.io/etcd/server/v3/etcdmain and k8s.io/kubernetes/cmd/kube-apiserver/app).
//
// Watchdog: when the environment variable KRL_EXIT_ON_STDIN_EOF=1 is set, the
// process exits as soon as its standard input reaches end-of-file, i.e. when
// the parent that holds the write end of the pipe exits or is killed (even by
// SIGKILL). When KRL_CLEANUP_DIR is set too, that directory is removed first.
// This keeps a crashed test run from leaving etcd or kube-apiserver behind.
package main

import (
	"fmt"
	"io"
	"os"
	_ "time/tzdata" // for timeZone support in CronJob, as upstream kube-apiserver does

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // load all the prometheus client-go plugins
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/component-base/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func usage() {
	fmt.Fprintln(os.Stderr, "usage: krl-control-plane etcd [flags...] | krl-control-plane kube-apiserver [flags...] | krl-control-plane version")
	os.Exit(2)
}

// watchStdin exits the process when stdin reaches EOF (parent gone).
func watchStdin() {
	if os.Getenv("KRL_EXIT_ON_STDIN_EOF") != "1" {
		return
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		if dir := os.Getenv("KRL_CLEANUP_DIR"); dir != "" {
			_ = os.RemoveAll(dir)
		}
		fmt.Fprintln(os.Stderr, "krl-control-plane: stdin closed (parent gone), exiting")
		os.Exit(0)
	}()
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	sub := os.Args[1]
	rest := os.Args[2:]
	switch sub {
	case "etcd":
		watchStdin()
		os.Args = append([]string{"etcd"}, rest...)
		etcdmain.Main(os.Args)
	case "kube-apiserver":
		watchStdin()
		os.Args = append([]string{"kube-apiserver"}, rest...)
		command := app.NewAPIServerCommand()
		os.Exit(cli.Run(command))
	case "version", "--version":
		fmt.Println(version.Get().GitVersion)
	default:
		usage()
	}
}
