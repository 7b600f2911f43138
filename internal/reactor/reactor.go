package reactor

// Handler is what a loop runs for a socket.
type Handler interface {
	// LoopReady handles a readable socket: it reads it (Item.Read, the loop's
	// duplicate) and reports whether the socket stays in the loop. A
	// handler that returns false has ended the connection. It is also
	// called when the socket is writable while its output waits
	// (WantWrite), and for a hang-up or an error while its reads are held
	// (HoldReads).
	LoopReady(it *Item) (keep bool)
	// LoopResume takes up a handler that suspended (Item.Suspend)
	// once its wait is over, on the loop, with LoopReady's result.
	LoopResume(it *Item) (keep bool)
	// LoopStale reports whether the connection was ended by another
	// goroutine meanwhile (its wake-up may have found the handler
	// running); LoopEnd then ends it, on a goroutine of its own.
	LoopStale() bool
	LoopEnd()
	// LoopDetach is called when a handler that waited (Yield) is done and
	// kept the connection: true if the connection goes on on a goroutine
	// of its own from now on (it was taken out of the loop), false if it
	// goes back in.
	LoopDetach() bool
}

// Stats are the engine's counts of what its loops did, for tests and
// benchmarks.
type Stats struct {
	Parks     uint64 // handlers that waited on their loop
	Moves     uint64 // sockets moved to another loop (MoveNear)
	TakeOvers uint64 // loops handed to a new goroutine (Yield, the monitor)
	Rescues   uint64 // of those, the monitor's (a handler ran a whole tick)
	Detaches  uint64 // sockets that left the loops for a goroutine (LoopDetach)
}
