// Package activation implements systemd's socket activation protocol on
// both sides, with no dependency:
//
//   - Receiving (Take): a process started by systemd (or any compatible
//     activator) with LISTEN_PID = its pid, LISTEN_FDS = n and, optionally,
//     LISTEN_FDNAMES = name:name:... finds its n sockets at file
//     descriptors 3..3+n-1. Take returns them as net.Listener or
//     net.PacketConn with their names and clears the variables, so child
//     processes do not take them again. `mosto proxy` uses them instead of
//     binding its listeners (internal/relay matches them by name or
//     address).
//   - Passing (Activator): a small systemd-compatible activator for tests
//     and benchmarks that holds listening sockets, starts a command at the
//     first connection with the sockets at fd 3.. and the three variables
//     (LISTEN_PID set by a shell that execs the command, as systemd sets
//     it between fork and exec), and waits for it to exit.
//
// See sd_listen_fds(3) and systemd.socket(5).
package activation
