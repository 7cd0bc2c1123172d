// Package getbench is `mosto bench get`: seed 003's three scenarios in an
// emulated world (internal/emu) built from WonderProxy RTTs, with sources at
// real cities behind per-source bottleneck rates: multi-source (12 MB from
// 3 sources, against each single source, aria2c with the same mirrors and
// curl from the best source), failure (50 MB, the fastest source silent for
// 7 s from 20% of the transfer, mosto get and aria2c; also failure-access,
// the same in a second world shaped like the seed's, where one shared access
// link and not the sources' own links is the limit, so the other sources
// can rise: AccessSpec; FailureBound gives each world's least cost of the
// silence) and multipath (50 MB,
// 2 sources, one path each against two disjoint paths each: direct and
// through a mosto proxy's SOCKS5 entry). Origins run in this process in
// their hosts' namespaces; aria2c, curl and the proxies run as processes
// there. Every download's SHA-256 is checked. The package owns the world,
// the origins and the processes of one Run and stops them before it
// returns.
package getbench
