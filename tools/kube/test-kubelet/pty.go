package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openPty opens a new pseudo-terminal pair. The ioctls go through SyscallConn so the master
// stays in non-blocking mode under Go's poller (File.Fd would switch it to blocking).
func openPty() (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	var n int
	var ioctlErr error
	if err := control(master, func(fd int) {
		if ioctlErr = unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); ioctlErr == nil {
			n, ioctlErr = unix.IoctlGetInt(fd, unix.TIOCGPTN)
		}
	}); err != nil || ioctlErr != nil {
		_ = master.Close()
		return nil, nil, fmt.Errorf("pty: %v %v", err, ioctlErr)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = master.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

func setWinsize(f *os.File, cols, rows uint16) error {
	var ioctlErr error
	if err := control(f, func(fd int) {
		ioctlErr = unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows})
	}); err != nil {
		return err
	}
	return ioctlErr
}

func control(f *os.File, fn func(fd int)) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return raw.Control(func(fd uintptr) { fn(int(fd)) })
}
