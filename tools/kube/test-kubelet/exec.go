package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"syscall"
	"time"

	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

// Streams of an exec stay open this long without traffic (a terminal left idle); the kubelet's
// default is 4 h as well.
const streamIdleTimeout = 4 * time.Hour

// A background child still holding stdout or the terminal after the command exits delays the
// exit status by at most this long.
const outputGrace = 2 * time.Second

// serveExec is the kubelet endpoint the API server proxies pods/exec to (it translates a
// client's v5 WebSocket to SPDY, or passes a WebSocket through); remotecommand.ServeExec is the
// kubelet's own protocol code.
func (t *podTable) serveExec(w http.ResponseWriter, req *http.Request) {
	key := req.PathValue("namespace") + "/" + req.PathValue("pod")
	opts, err := remotecommand.NewOptions(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	entry := t.get(key)
	if entry == nil {
		http.Error(w, fmt.Sprintf("pod %s is not running on this node", key), http.StatusNotFound)
		return
	}
	command := req.URL.Query()["command"]
	remotecommand.ServeExec(w, req, &executor{table: t, entry: entry}, key, "", req.PathValue("container"), command,
		opts, streamIdleTimeout, remotecommand.DefaultStreamCreationTimeout, remotecommand.SupportedStreamingProtocols)
}

type executor struct {
	table *podTable
	entry *podEntry
}

func (e *executor) ExecInContainer(ctx context.Context, _ string, _ string, _ string, cmd []string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize, _ time.Duration) error {
	if len(cmd) == 0 {
		return errors.New("no command")
	}
	c := exec.Command(cmd[0], cmd[1:]...)
	c.Dir = e.entry.dir
	c.Env = e.entry.env
	c.WaitDelay = outputGrace
	if tty {
		return e.runTTY(ctx, c, in, out, resize)
	}
	return e.runPipes(ctx, c, in, out, errOut)
}

func (e *executor) runPipes(ctx context.Context, c *exec.Cmd, in io.Reader, out, errOut io.Writer) error {
	// Its own process group, so a disconnect or the pod's deletion ends the command and all it started.
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if out != nil {
		c.Stdout = out
	}
	if errOut != nil {
		c.Stderr = errOut
	}
	var stdin io.WriteCloser
	if in != nil {
		var err error
		if stdin, err = c.StdinPipe(); err != nil {
			return err
		}
	}
	if err := c.Start(); err != nil {
		return err
	}
	defer e.table.track(e.entry, c.Process.Pid)()
	if stdin != nil {
		go func() {
			_, _ = io.Copy(stdin, in)
			_ = stdin.Close() // the client closed stdin (v5 CLOSE, or SPDY half-close): EOF
		}()
	}
	return exitStatus(waitOrKill(ctx, c))
}

func (e *executor) runTTY(ctx context.Context, c *exec.Cmd, in io.Reader, out io.Writer, resize <-chan remotecommand.TerminalSize) error {
	master, slave, err := openPty()
	if err != nil {
		return err
	}
	defer func() { _ = master.Close() }()
	c.Stdin, c.Stdout, c.Stderr = slave, slave, slave
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		_ = slave.Close()
		return err
	}
	_ = slave.Close()
	defer e.table.track(e.entry, c.Process.Pid)()
	if resize != nil {
		go func() {
			for size := range resize {
				_ = setWinsize(master, size.Width, size.Height)
			}
		}()
	}
	if in != nil {
		go func() { _, _ = io.Copy(master, in) }()
	}
	if out == nil {
		out = io.Discard
	}
	copied := make(chan struct{})
	go func() {
		_, _ = io.Copy(out, master) // ends with EIO once nothing holds the terminal
		close(copied)
	}()
	err = waitOrKill(ctx, c)
	select {
	case <-copied:
	case <-time.After(outputGrace):
		_ = master.SetReadDeadline(time.Now()) // a background child keeps the terminal open
		<-copied
	}
	return exitStatus(err)
}

// waitOrKill waits for the command; if the client goes away first, its process group is killed.
func waitOrKill(ctx context.Context, c *exec.Cmd) error {
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		case <-done:
		}
	}()
	return c.Wait()
}

// exitStatus turns a finished command into what ServeExec reports: nil for 0, an ExitError with
// the code otherwise (128+n for a death by signal n, as container runtimes report it).
func exitStatus(err error) error {
	if err == nil || errors.Is(err, exec.ErrWaitDelay) {
		return nil
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		status, ok := exitErr.Sys().(syscall.WaitStatus)
		if !ok {
			return utilexec.CodeExitError{Err: err, Code: exitErr.ExitCode()}
		}
		if status.Signaled() {
			return utilexec.CodeExitError{Err: err, Code: 128 + int(status.Signal())}
		}
		return utilexec.CodeExitError{Err: err, Code: status.ExitStatus()}
	}
	return err
}
