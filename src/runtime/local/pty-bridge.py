# Runs inside a sandbox (python3 -I -S -c <this> COLS ROWS ARGV...): forks ARGV on a new pty and
# bridges it to stdin/stdout, because Node has no pty binding.
# stdin carries frames: 1 type byte, 4-byte big-endian length, payload.
#   b'd' data for the terminal; b'r' resize, payload = cols, rows as two big-endian u16.
# stdout carries the raw terminal output. Writes to stdout block, so a consumer that stops reading
# stops this loop reading the pty: the pty fills and the program in it blocks (backpressure).
# The exit status is the program's (128+n when signal n ended it).
import fcntl, os, select, signal, struct, sys, termios

cols, rows, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]


def set_size(fd, c, r):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack('HHHH', r, c, 0, 0))


pid, master = os.forkpty()
if pid == 0:
    set_size(0, cols, rows)
    try:
        os.execvp(argv[0], argv)
    finally:
        os._exit(127)

set_size(master, cols, rows)
signal.signal(signal.SIGHUP, lambda *_: os.kill(pid, signal.SIGHUP))


def write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


pending, stdin_open = b'', True
while True:
    fds = [master, 0] if stdin_open else [master]
    try:
        ready, _, _ = select.select(fds, [], [])
    except InterruptedError:
        continue
    if master in ready:
        try:
            out = os.read(master, 65536)
        except OSError:  # EIO: every holder of the terminal's other side is gone
            out = b''
        if not out:
            break
        write_all(1, out)
    if 0 in ready:
        chunk = os.read(0, 65536)
        if not chunk:  # the runtime hung up: so does the terminal
            stdin_open = False
            os.kill(pid, signal.SIGHUP)
            continue
        pending += chunk
        while len(pending) >= 5:
            kind, size = pending[0], struct.unpack('>I', pending[1:5])[0]
            if len(pending) < 5 + size:
                break
            payload, pending = pending[5:5 + size], pending[5 + size:]
            if kind == ord('d'):
                write_all(master, payload)
            elif kind == ord('r') and size == 4:
                set_size(master, *struct.unpack('>HH', payload))

_, status = os.waitpid(pid, 0)
code = os.waitstatus_to_exitcode(status)
sys.exit(128 - code if code < 0 else code)
