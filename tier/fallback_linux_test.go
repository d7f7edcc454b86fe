package tier

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/uringtier/uringtier/linux_test/noring"
	"github.com/uringtier/uringtier/uring"
)

// conformanceSuite is every test of this package that a child without io_uring runs. Go cannot list
// a package's tests at run time, so TestConformanceSuiteComplete checks this list against the source.
var conformanceSuite = []suiteTest{
	{"TestLookupHitMissPrefix", TestLookupHitMissPrefix},
	{"TestLookupPrefixSkips", TestLookupPrefixSkips},
	{"TestLookupColdDentries", TestLookupColdDentries},
	{"TestDuplicateAndSharedKeys", TestDuplicateAndSharedKeys},
	{"TestLookupCache", TestLookupCache},
	{"TestLookupsAnsweredInCall", TestLookupsAnsweredInCall},
	{"TestLookupsInCallWhileOwnersWrite", TestLookupsInCallWhileOwnersWrite},
	{"TestOwnersHashLargeBatches", TestOwnersHashLargeBatches},
	{"TestLoad", TestLoad},
	{"TestLoadCorrupt", TestLoadCorrupt},
	{"TestLoadOtherBlockSize", TestLoadOtherBlockSize},
	{"TestLoadOneBufferTwice", TestLoadOneBufferTwice},
	{"TestBuffersOfAGiB", TestBuffersOfAGiB},
	{"TestBuffersInHugePages", TestBuffersInHugePages},
	{"TestBufferMemory", TestBufferMemory},
	{"TestCancelDuringSubmit", TestCancelDuringSubmit},
	{"TestStore", TestStore},
	{"TestStoreDirectoryVanished", TestStoreDirectoryVanished},
	{"TestStoreFromBuffers", TestStoreFromBuffers},
	{"TestDelete", TestDelete},
	{"TestCapacityEvictsLRU", TestCapacityEvictsLRU},
	{"TestEvictPastBlocksUsedElsewhere", TestEvictPastBlocksUsedElsewhere},
	{"TestCapacityFull", TestCapacityFull},
	{"TestOneEvictor", TestOneEvictor},
	{"TestStatfsSkipsRescans", TestStatfsSkipsRescans},
	{"TestFullUntilCounted", TestFullUntilCounted},
	{"TestBadInput", TestBadInput},
	{"TestOpenRejectsBadOptions", TestOpenRejectsBadOptions},
	{"TestBusyAtDepth", TestBusyAtDepth},
	{"TestCancel", TestCancel},
	{"TestCloseWithWorkInFlight", TestCloseWithWorkInFlight},
	{"TestModel", TestModel},
	{"TestSubmitPollDoesNotAllocate", TestSubmitPollDoesNotAllocate},
	{"TestBurstLoadBiggerThanSQ", TestBurstLoadBiggerThanSQ},
	{"TestBurstStoresIntoNewDirectories", TestBurstStoresIntoNewDirectories},
	{"TestBlocksSpanManyChunks", TestBlocksSpanManyChunks},
	{"TestFailedOpenReleasesBuffers", TestFailedOpenReleasesBuffers},
	{"TestDirectoryIsAFile", TestDirectoryIsAFile},
	{"TestDirectBypassesPageCache", TestDirectBypassesPageCache},
	{"TestAfterClose", TestAfterClose},
	{"TestBuffersDuringClose", TestBuffersDuringClose},
	{"TestQuarantineLogged", TestQuarantineLogged},
	{"TestStoreAfterNamespaceRemoved", TestStoreAfterNamespaceRemoved},
	{"TestStoreAfterFanoutRemoved", TestStoreAfterFanoutRemoved},
	{"TestStoreAfterRepeatedRemoval", TestStoreAfterRepeatedRemoval},
	{"TestNamespaceRecreatedElsewhere", TestNamespaceRecreatedElsewhere},
	{"TestNotRegularAtBlockPath", TestNotRegularAtBlockPath},
	{"TestSymlinkedFanoutDir", TestSymlinkedFanoutDir},
	{"TestFileInPlaceOfFanoutDir", TestFileInPlaceOfFanoutDir},
	{"TestLogsStateChangesOnly", TestLogsStateChangesOnly},
	{"TestVLLMRawCorrupt", TestVLLMRawCorrupt},
	{"TestVLLMRawStore", TestVLLMRawStore},
	{"TestVLLMScriptDirectory", TestVLLMScriptDirectory},
	{"TestVLLMOptions", TestVLLMOptions},
}

// suiteTest is a test of this package by name, for the tests that run others.
type suiteTest struct {
	name string
	f    func(*testing.T)
}

// notInConformanceSuite is every other test of this package, with the reason it stays out.
var notInConformanceSuite = map[string]string{
	"TestColdLookupsAskStatxFirst":               "it counts the io_uring engine's SQEs",
	"TestColdLookupsStayColdInAPartlyCachedTree": "it counts the io_uring engine's SQEs",
	"TestOpenFailsCleanly":                       "it makes the io_uring engine's set-up fail, which needs io_uring",
	"TestEngineEnvOverridesAuto":                 "it asks for io_uring through URINGTIER_ENGINE=uring, which must fail without it; linux_test.TestNoIOURing checks that failure",
	"TestConformanceWithoutIOURing":              "it is the test that runs the suite in the child",
	"TestConformanceSuiteComplete":               "it checks the list, not the tier",
	"TestLargeLookupsLed":                        "the sync engine has one owner, which leads no lookup",
	"TestLeadsAtClose":                           "the sync engine has one owner, which leads no lookup",
	"TestGatherWindow":                           "it checks the io_uring engine's owners' arithmetic",
	"TestIntakeYields":                           "it checks when the io_uring engine's owners yield",
	"TestOwnersYieldToWaiters":                   "it counts the io_uring engine's owners' yields of their P",
	"TestOwnersLingerWhileAsked":                 "it counts the io_uring engine's owners' lingers",
	"TestLookupWakesOwnerOnEventfd":              "it counts the io_uring engine's owners' sleeps on their ring's eventfd",
	"TestLookupCacheLoadEndsAfterDelete":         "it holds a load's checksum aside, which only the io_uring engine does",
	"TestInvalidateLookupsInFlight":              "it holds a sync engine worker's op after its program ran (the cache it tests is the shards', common to both engines)",
	"TestLookupAfterChangeStartsItsOwn":          "it holds a sync engine worker's op after its program ran (the sharing it tests is the shards', common to both engines)",
	"TestBrokenRingFailsTheTier":                 "it injects a fault into the io_uring engine's ring",
	"TestBrokenRingKeepsKernelBuffers":           "it injects a fault into the io_uring engine's ring",
	"TestBrokenRingHoldsTakenPoolWrites":         "it injects a fault into the io_uring engine's ring",
	"TestStrayCompletionFailsTheTier":            "it posts a completion on the io_uring engine's ring",
	"TestReapUnderPressure":                      "it shrinks the io_uring engine's queues",
	"TestRingBreaksMidBatch":                     "it injects a fault into the io_uring engine's ring",
	"TestBrokenRingFailsPoolWrites":              "it injects a fault into the io_uring engine's ring",
	"TestCQESkipCompletes":                       "it checks how the io_uring engine completes steps that post no completion",
	"TestSubmitChunks":                           "it counts the io_uring engine's submissions",
	"TestLockedOwnerWithSpareP":                  "it checks how the io_uring engine's owners sleep",
	"TestLoadsSpreadOverRings":                   "it needs two io_uring rings; the sync engine has one shard",
	"TestLoadLearnedBeforeInvalidate":            "it needs two io_uring rings; the sync engine has one shard",
	"TestLoadsKeepToTheirBuffersRing":            "it needs two io_uring rings; the sync engine has one shard",
	"TestHugeBlock":                              "it moves 2 GiB through each engine; the sync engine it would run in the child is the same code as here",
	"TestLogBreaker":                             "it needs a FUSE mount, and the breaker is the shard's, the same code with either engine",
	"TestLogFallback":                            "it starts its own child without io_uring",
	"TestNoteQuarantine":                         "it calls the engines' hook directly, on the sync engine already",
	"TestFailureClasses":                         "it needs a FUSE mount; the counting is the shard's, the same code with either engine",
	"TestLookupsInFlightBounded":                 "it bounds the io_uring engine's lookups in flight; the sync engine's workers bound its own",
	"TestSyncWorkerHoldsOneOpOnFUSE":             "it needs a FUSE mount and runs the sync engine already",
	"TestProbedSlotsEmptied":                     "it reads the io_uring engine's fixed-file table",
	"TestEstimate":                               "it is arithmetic on the capacity's counters, no engine involved",
	"TestOpIndex":                                "it checks a table of the shard, no engine involved",
	"TestVLLMConcurrentWriters":                  "it races a Python process for seconds per engine; the sync engine it would run in the child is the same code as here",
	"TestLazyWakeTakenIn":                        "it hooks the io_uring engine's owner, whose stores and loads may not wake it",
	"TestLoadsJudgedAside":                       "it runs tests of the suite with the io_uring engine's loads judged aside",
	"TestLoadsInParts":                           "it runs tests of the suite with loads read and checksummed in parts",
	"TestCancelWhileJudgedAside":                 "it holds a load of the io_uring engine in its Judge aside",
	"TestRingBreaksWhileJudgedAside":             "it holds a load of the io_uring engine in its Judge aside and breaks the ring",
	"TestStoresSync":                             "it counts the io_uring engine's SQEs for stores on and off its rings",
	"TestStoresOnRing":                           "it runs tests of the suite with the io_uring engine's stores on its rings",
	"TestCloseWithRingWritesInFlight":            "it watches the io_uring engine's store pool hand writes to its rings",
	"TestFewStoresWriteThemselves":               "it watches which stores the io_uring engine's store pool writes on its rings",
	"TestStoresWriteOnRing":                      "it runs tests of the suite with the io_uring engine's O_DIRECT store writes on its rings",
	"TestStuckPooledStore":                       "it holds a store on the io_uring engine's store pool",
	"TestLoadsSyncOnTmpfs":                       "it counts the io_uring engine's SQEs for loads on a tmpfs",
	"TestLoadsOnPool":                            "it runs tests of the suite with the io_uring engine's loads on its pool",
	"TestRawSubmitOnlyLocal":                     "it reads how the io_uring engine's rings submit",
}

// TestConformanceWithoutIOURing runs the conformance suite in a child process of this test binary
// in each noring mode (seccomp ENOSYS, seccomp EPERM, kernel.io_uring_disabled=2), with
// URINGTIER_ENGINE unset: EngineAuto must fall back to the sync engine, naming the cause, and every
// test must pass on it (forEachEngine runs only the sync engine there).
func TestConformanceWithoutIOURing(t *testing.T) {
	for _, mode := range noring.Modes {
		t.Run(mode.String(), func(t *testing.T) {
			if m, ok := noring.InChild(); ok {
				require.Equal(t, mode, m, "child started in another mode")
				tr, err := Open(t.TempDir(), Options{BlockSize: testBlockSize})
				require.NoError(t, err)
				info := tr.Engine()
				require.NoError(t, tr.Close(context.Background()))
				require.Equal(t, EngineSync, info.Kind, "EngineAuto without io_uring")
				require.Equal(t, uring.Available().Error(), info.Fallback, "Fallback should say why io_uring is unusable")
				for _, c := range conformanceSuite {
					t.Run(c.name, c.f)
				}
				return
			}
			t.Setenv(EngineEnv, "") // the child must choose by itself
			noring.Run(t, mode, t.Name())
		})
	}
}

// TestConformanceSuiteComplete fails when a test is added to this package without being added to
// conformanceSuite (or, with a reason, to notInConformanceSuite), so the suite without io_uring
// cannot silently shrink.
func TestConformanceSuiteComplete(t *testing.T) {
	files, err := filepath.Glob("*_test.go")
	require.NoError(t, err)
	listed := map[string]bool{}
	for _, c := range conformanceSuite {
		listed[c.name] = true
	}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || len(fn.Name.Name) < 5 || fn.Name.Name[:4] != "Test" || fn.Name.Name == "TestMain" {
				continue
			}
			_, excluded := notInConformanceSuite[fn.Name.Name]
			require.True(t, listed[fn.Name.Name] || excluded,
				"%s (%s) is in neither conformanceSuite nor notInConformanceSuite", fn.Name.Name, name)
		}
	}
}
