// Command pause is the sandbox ("pause") container of a pod: it holds the
// pod's namespaces open and does nothing else. As PID 1 of the sandbox it
// also reaps orphans, and it exits cleanly on SIGTERM or SIGINT. Built
// static (CGO_ENABLED=0) for a scratch-style image (tools/mkimage).
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "-v" {
		// As the real pause does. It also makes this the smallest Go
		// program the project ships: make bench times its start-up and
		// exit as the floor under any Go CNI plugin's exec.
		fmt.Println("pause (nftredir)")
		return
	}
	if len(os.Args) > 1 {
		fmt.Fprintln(os.Stderr, "pause: takes no arguments but -v")
		os.Exit(2)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		// One SIGCHLD can stand for several exits: reap all there are.
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
