// Command goelect is a client-go leader-election candidate on a
// coordination.k8s.io/v1 Lease, used by the Rust tests to check that
// kube-runtime-lease and client-go honour each other's leases.
//
// It prints one line per event on stdout (each line is one write, unbuffered):
//
//	READY <monotonic_nanos>
//	EVENT started-leading <monotonic_nanos> <identity>
//	EVENT stopped-leading <monotonic_nanos> <identity>
//	EVENT new-leader <monotonic_nanos> <leader-identity-or-empty>
//	WORK <monotonic_nanos>                     (with --ledger)
//	LEDGER <monotonic_nanos> <outcome> [error] (with --ledger)
//
// With --ledger=NAME, each term appends to the ConfigMap NAME in --namespace
// every --work-interval, as a client-go user's guarded work would: read it,
// stop if the leading context is done, append a line and Update with the
// resourceVersion read (an optimistic write). client-go hands out no fencing
// token, so the line's token field is "-". The ConfigMap holds the chaos
// run's ledger (see harness/src/chaos/ledger.rs for its format).
//
// monotonic_nanos is CLOCK_MONOTONIC in nanoseconds. When the identity is
// empty the line ends with a single space after the nanos; parse with a
// whitespace split and treat the fourth field as optional.
//
// client-go calls OnStoppedLeading whenever Run returns, also when this
// candidate never led. On SIGTERM/SIGINT (or stdin EOF with
// --exit-on-stdin-eof) the context is cancelled, the lease is released when
// --release-on-cancel is true, and the process exits 0 after
// stopped-leading. When leadership is lost without a cancel, it exits 1, or
// campaigns again with --rejoin.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

var outMu sync.Mutex

func monoNanos() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// emit writes one line to stdout in a single write (os.Stdout is unbuffered).
func emit(line string) {
	outMu.Lock()
	defer outMu.Unlock()
	_, _ = os.Stdout.WriteString(line + "\n")
}

func event(kind, identity string) {
	emit(fmt.Sprintf("EVENT %s %d %s", kind, monoNanos(), identity))
}

// ledgerKeep is how many lines the ledger keeps (the chaos runner's watch
// sees every version, so older lines are not lost to it).
const ledgerKeep = 100

// writeLedger appends to the ledger ConfigMap until ctx (the leading context
// of one term) is done.
func writeLedger(ctx context.Context, client kubernetes.Interface, namespace, name, identity, term string, every time.Duration) {
	cms := client.CoreV1().ConfigMaps(namespace)
	for seq := 1; ; seq++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		emit(fmt.Sprintf("WORK %d", monoNanos()))
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			emit(fmt.Sprintf("LEDGER %d error %s", monoNanos(), strings.ReplaceAll(err.Error(), "\n", " ")))
			continue
		}
		// client-go's way to ask "do I still lead?": the leading context.
		if ctx.Err() != nil {
			emit(fmt.Sprintf("LEDGER %d term-ended", monoNanos()))
			return
		}
		n, _ := strconv.ParseInt(cm.Data["count"], 10, 64)
		n++
		line := fmt.Sprintf("%d - %s %s %d %d", n, identity, term, seq, monoNanos())
		lines := strings.Split(strings.TrimSpace(cm.Data["ledger"]), "\n")
		if lines[0] == "" {
			lines = nil
		}
		lines = append(lines, line)
		if len(lines) > ledgerKeep {
			lines = lines[len(lines)-ledgerKeep:]
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data["ledger"] = strings.Join(lines, "\n")
		cm.Data["count"] = strconv.FormatInt(n, 10)
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			outcome := "error"
			if apierrors.IsConflict(err) {
				outcome = "conflict"
			}
			emit(fmt.Sprintf("LEDGER %d %s %s", monoNanos(), outcome, strings.ReplaceAll(err.Error(), "\n", " ")))
			continue
		}
		emit(fmt.Sprintf("LEDGER %d written %d", monoNanos(), n))
	}
}

func main() {
	klog.InitFlags(nil)
	kubeconfig := flag.String("kubeconfig", "", "path to a kubeconfig file (required)")
	namespace := flag.String("namespace", "default", "namespace of the Lease")
	name := flag.String("name", "", "name of the Lease (required)")
	identity := flag.String("identity", "", "holder identity of this candidate (default: hostname_pid)")
	leaseDuration := flag.Duration("lease-duration", 15*time.Second, "LeaseDuration")
	renewDeadline := flag.Duration("renew-deadline", 10*time.Second, "RenewDeadline")
	retryPeriod := flag.Duration("retry-period", 2*time.Second, "RetryPeriod")
	releaseOnCancel := flag.Bool("release-on-cancel", true, "release the lease when cancelled (SIGTERM/SIGINT)")
	rejoin := flag.Bool("rejoin", false, "campaign again after losing leadership instead of exiting 1")
	exitOnStdinEOF := flag.Bool("exit-on-stdin-eof", false, "treat EOF on stdin like SIGTERM (parent-death watchdog)")
	qps := flag.Float64("qps", 50, "client QPS")
	ledger := flag.String("ledger", "", "a ConfigMap in --namespace that each term appends to (the chaos run's ledger)")
	workInterval := flag.Duration("work-interval", 100*time.Millisecond, "how often a term appends to --ledger")
	coordinated := flag.Bool("coordinated", false, "Coordinated Leader Election: publish a LeaseCandidate (NewCandidate) and let the API server elect (LeaderElectionConfig.Coordinated)")
	binaryVersion := flag.String("binary-version", "1.37.0", "the LeaseCandidate's binaryVersion (with --coordinated)")
	emulationVersion := flag.String("emulation-version", "", "the LeaseCandidate's emulationVersion (with --coordinated; default: the binary version)")
	flag.Parse()

	if *kubeconfig == "" || *name == "" {
		fmt.Fprintln(os.Stderr, "goelect: --kubeconfig and --name are required")
		os.Exit(2)
	}
	if *identity == "" {
		host, _ := os.Hostname()
		*identity = fmt.Sprintf("%s_%d", host, os.Getpid())
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "goelect: loading kubeconfig: %v\n", err)
		os.Exit(2)
	}
	cfg.QPS = float32(*qps)
	cfg.Burst = int(*qps * 2)
	cfg.UserAgent = "goelect/" + *identity
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "goelect: creating client: %v\n", err)
		os.Exit(2)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		cancel()
		// A second signal forces the exit.
		<-sigs
		os.Exit(130)
	}()
	if *exitOnStdinEOF {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			cancel()
		}()
	}

	lock := &resourcelock.LeaseLock{
		LeaseMeta: metav1.ObjectMeta{Namespace: *namespace, Name: *name},
		Client:    client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{
			Identity: *identity,
		},
	}
	id := *identity
	var terms atomic.Int64
	lec := leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   *leaseDuration,
		RenewDeadline:   *renewDeadline,
		RetryPeriod:     *retryPeriod,
		ReleaseOnCancel: *releaseOnCancel,
		Name:            *name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leading context.Context) {
				event("started-leading", id)
				if *ledger != "" {
					// A term is this process and the count of its terms.
					term := fmt.Sprintf("%d:%d", os.Getpid(), terms.Add(1))
					go writeLedger(leading, client, *namespace, *ledger, id, term, *workInterval)
				}
			},
			OnStoppedLeading: func() { event("stopped-leading", id) },
			OnNewLeader:      func(leader string) { event("new-leader", leader) },
		},
	}
	if *coordinated {
		ev := *emulationVersion
		if ev == "" {
			ev = *binaryVersion
		}
		// As kube-controller-manager does: the candidate is named after the
		// identity, in the Lease's namespace, and runs beside the elector.
		candidate, synced, err := leaderelection.NewCandidate(client, *namespace, id, *name, *binaryVersion, ev, "OldestEmulationVersion")
		if err != nil {
			fmt.Fprintf(os.Stderr, "goelect: creating the LeaseCandidate controller: %v\n", err)
			os.Exit(2)
		}
		go candidate.Run(ctx)
		synced.WaitForCacheSync(ctx.Done())
		lec.Coordinated = true
	}
	elector, err := leaderelection.NewLeaderElector(lec)
	if err != nil {
		fmt.Fprintf(os.Stderr, "goelect: invalid leader election config: %v\n", err)
		os.Exit(2)
	}

	emit(fmt.Sprintf("READY %d", monoNanos()))
	for {
		elector.Run(ctx)
		if ctx.Err() != nil {
			os.Exit(0)
		}
		if !*rejoin {
			os.Exit(1)
		}
		// A fresh elector so that its observed state starts clean.
		if elector, err = leaderelection.NewLeaderElector(lec); err != nil {
			fmt.Fprintf(os.Stderr, "goelect: %v\n", err)
			os.Exit(2)
		}
	}
}
