// Package reactor is poolerd's event loops (event_loops): each loop is an
// epoll instance and the goroutine running it, reading the sockets put in
// it (client sessions and server connections) without a goroutine each.
// It knows nothing of PostgreSQL: a socket's handler (Handler, implemented
// by internal/proxy's session and serverConn) is called when the socket is
// readable and does the protocol's work.
//
// A loop's goroutine asks epoll, with a zero timeout, what is ready,
// handles every ready socket with raw non-blocking reads (Item.Read), and
// when nothing is ready parks in the runtime poller, which watches the
// epoll descriptor like any socket. One wake-up of the loop so handles
// every socket that became ready meanwhile, where a goroutine per
// connection costs a wake-up (and often a thread hand-off) each.
//
// Waits stay on the loop: a handler that must wait for something another
// goroutine delivers (a pooled server connection) suspends (Item.Suspend)
// and returns; the delivery (Item.WakeUp) posts the item to its loop's
// mailbox (an eventfd in the loop's epoll), and the loop runs the
// handler's LoopResume, in the order posted. A timed wait (Item.Sleep)
// ends at its timer or, if asked, at an event on its socket.
//
// Output that a socket cannot take now need not block its writer: the
// handler keeps it and says so (Item.WantWrite); the loop then runs its
// LoopReady when the socket is writable (a client's: not for what it
// sends) until the handler says it is all sent. A handler can also stop
// its socket being read for a while (Item.HoldReads: the peer it feeds
// does not take what it has), from any goroutine.
//
// A handler may block otherwise: then the goroutine
// running it gives the loop to a new goroutine and finishes the handler on
// its own, with the socket it was handling taken out of the loop, so
// nothing of that socket is read until the handler is done (no
// reordering), and nothing else waits for it. Handlers say when they are
// about to block (Item.Yield: a write that would wait); a monitor hands
// over a loop whose handler has run for a whole tick without saying so.
//
// The loop reads through its own duplicate of the socket's descriptor, so
// the socket stays open, and its registration valid, until the loop lets
// it go: whoever closes such a connection shuts the socket down first
// (ShutdownSocket), which the loop sees as the end of the stream.
//
// Only Linux has the loops (epoll); elsewhere New starts none and every
// connection has a goroutine of its own.
package reactor
