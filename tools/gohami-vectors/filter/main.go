// Command filter runs Go HAMi's real scheduler Filter (pkg/scheduler's Scheduler.Filter, the
// extender's filter verb) on a small fake cluster per case of cases.json: the nodes as each
// vendor's device plug-in leaves them, the pods already placed there (their decisions count as
// usage), and one pod to place. It records which node Go chose, the nodes it refused with
// their reasons, and the pod annotations its Filter wrote (the devices to allocate and each
// vendor's PatchAnnotations), so that this project's scheduler can be fed the same inputs and
// compared (tests/test_go_filter_vectors.py). The scheduler runs as in a cluster: its informers
// over a fake clientset, RegisterFromNodeAnnotations reading every node once, then Filter. It is
// built against an unpacked Go HAMi tree by scripts/gen-go-vectors.sh; nothing of Go HAMi is
// copied into this repository.
//
//	filter -cases cases.json -out vectors.json -commit <sha> -command "<how it was run>"
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/Project-HAMi/HAMi/pkg/device/ascend"
	"github.com/Project-HAMi/HAMi/pkg/device/cambricon"
	"github.com/Project-HAMi/HAMi/pkg/device/hygon"
	"github.com/Project-HAMi/HAMi/pkg/device/iluvatar"
	"github.com/Project-HAMi/HAMi/pkg/device/kunlun"
	"github.com/Project-HAMi/HAMi/pkg/device/metax"
	"github.com/Project-HAMi/HAMi/pkg/device/mthreads"
	"github.com/Project-HAMi/HAMi/pkg/device/nvidia"
	"github.com/Project-HAMi/HAMi/pkg/scheduler"
	"github.com/Project-HAMi/HAMi/pkg/scheduler/config"
	"github.com/Project-HAMi/HAMi/pkg/util/client"
)

const functions = "scheduler.NewScheduler, Scheduler.Start, Scheduler.RegisterFromNodeAnnotations, " +
	"Scheduler.WaitForCacheSync, Scheduler.Filter, config.InitDevicesWithConfig"

// Values Filter writes from the clock; the file keeps a stand-in so that it does not change
// with every run.
var volatile = map[string]string{
	"hami.io/vgpu-time":             "<unix seconds>",
	"predicate-time":                "<unix seconds>",
	"metax-tech.com/predicate-time": "<unix nanoseconds>",
	"mthreads.com/predicate-time":   "<unix nanoseconds>",
}

const namespace = "default"

type caseFile struct {
	NodePolicy string `json:"node_policy"`
	Cases      []struct {
		Name   string            `json:"name"`
		Vendor string            `json:"vendor"`
		Nodes  []json.RawMessage `json:"nodes"`
		Placed []json.RawMessage `json:"placed,omitempty"`
		Pod    json.RawMessage   `json:"pod"`
	} `json:"cases"`
}

type goAnswer struct {
	NodeNames   []string          `json:"node_names"`
	FailedNodes map[string]string `json:"failed_nodes"`
	Error       string            `json:"error"`
	Annotations map[string]string `json:"annotations"`
}

type vector struct {
	Name   string            `json:"name"`
	Vendor string            `json:"vendor"`
	Nodes  []json.RawMessage `json:"nodes"`
	Placed []json.RawMessage `json:"placed"`
	Pod    json.RawMessage   `json:"pod"`
	Go     goAnswer          `json:"go"`
}

type vectorsFile struct {
	Commit     string   `json:"commit"`
	Command    string   `json:"command"`
	GoVersion  string   `json:"go_version"`
	Functions  string   `json:"functions"`
	NodePolicy string   `json:"node_policy"`
	Volatile   []string `json:"volatile"`
	Cases      []vector `json:"cases"`
}

func main() {
	runGenerator("filter vectors", "cases", "inputs (cases.json)", false, run)
}

func run(casesPath, outPath, commit, command, goVersion string) error {
	var in caseFile
	if err := readJSON(casesPath, &in); err != nil {
		return err
	}
	// Go's flags: its chart enables Ascend and Iluvatar; klog stays quiet (the file is the
	// record).
	fs := config.GlobalFlagSet()
	args := []string{"--enable-ascend=true", "--enable-iluvatar=true", "--logtostderr=false",
		"--stderrthreshold=FATAL"}
	if err := fs.Parse(args); err != nil {
		return err
	}
	klog.SetOutput(io.Discard)
	if in.NodePolicy != "" {
		config.NodeSchedulerPolicy = in.NodePolicy
	}
	if err := config.InitDevicesWithConfig(chartConfig()); err != nil {
		return err
	}
	file := vectorsFile{Commit: commit, Command: command, GoVersion: goVersion,
		Functions: functions, NodePolicy: config.NodeSchedulerPolicy}
	for key := range volatile {
		file.Volatile = append(file.Volatile, key)
	}
	sort.Strings(file.Volatile)
	for _, c := range in.Cases {
		answer, err := filterOne(c.Nodes, c.Placed, c.Pod)
		if err != nil {
			return fmt.Errorf("case %s: %w", c.Name, err)
		}
		placed := c.Placed
		if placed == nil {
			placed = []json.RawMessage{}
		}
		file.Cases = append(file.Cases, vector{Name: c.Name, Vendor: c.Vendor, Nodes: c.Nodes,
			Placed: placed, Pod: c.Pod, Go: answer})
	}
	data, err := json.MarshalIndent(file, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(outPath, append(data, '\n'), 0o644)
}

// filterOne starts a scheduler over a fake cluster of nodes and placed pods, and filters pod.
func filterOne(rawNodes, rawPlaced []json.RawMessage, rawPod json.RawMessage) (goAnswer, error) {
	objects := []runtime.Object{}
	names := []string{}
	for _, raw := range rawNodes {
		node := &corev1.Node{}
		if err := json.Unmarshal(raw, node); err != nil {
			return goAnswer{}, err
		}
		objects = append(objects, node)
		names = append(names, node.Name)
	}
	for _, raw := range rawPlaced {
		pod := &corev1.Pod{}
		if err := json.Unmarshal(raw, pod); err != nil {
			return goAnswer{}, err
		}
		if pod.Namespace == "" {
			pod.Namespace = namespace
		}
		objects = append(objects, pod)
	}
	pod := &corev1.Pod{}
	if err := json.Unmarshal(rawPod, pod); err != nil {
		return goAnswer{}, err
	}
	if pod.Namespace == "" {
		pod.Namespace = namespace
	}
	objects = append(objects, pod)
	cs := fake.NewClientset(objects...)
	client.KubeClient = cs
	s := scheduler.NewScheduler()
	if err := s.Start(); err != nil {
		return goAnswer{}, err
	}
	defer s.Stop()
	go s.RegisterFromNodeAnnotations()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if !s.WaitForCacheSync(ctx) {
		return goAnswer{}, fmt.Errorf("the scheduler did not read the nodes")
	}
	answer := goAnswer{FailedNodes: map[string]string{}, Annotations: map[string]string{}}
	res, err := s.Filter(extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
	if err != nil {
		answer.Error = err.Error()
	}
	if res != nil {
		if res.NodeNames != nil {
			answer.NodeNames = *res.NodeNames
		}
		for node, reason := range res.FailedNodes {
			answer.FailedNodes[node] = reason
		}
		answer.Error += res.Error
	}
	if answer.NodeNames == nil {
		answer.NodeNames = []string{}
	}
	stored, err := cs.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
	if err != nil {
		return goAnswer{}, err
	}
	for key, value := range stored.Annotations {
		if _, given := pod.Annotations[key]; given && pod.Annotations[key] == value {
			continue // the pod's own
		}
		if stand, ok := volatile[key]; ok {
			value = stand
		}
		answer.Annotations[key] = value
	}
	return answer, nil
}

// chartConfig is the device configuration of Go HAMi's Helm chart (the device ConfigMap of
// charts/hami at this commit) for the vendors compared, and NVIDIA's.
func chartConfig() *config.Config {
	return &config.Config{
		NvidiaConfig: nvidia.NvidiaConfig{
			ResourceCountName:            "nvidia.com/gpu",
			ResourceMemoryName:           "nvidia.com/gpumem",
			ResourceMemoryPercentageName: "nvidia.com/gpumem-percentage",
			ResourceCoreName:             "nvidia.com/gpucores",
			ResourcePriority:             "nvidia.com/priority",
			DefaultGPUNum:                1,
		},
		CambriconConfig: cambricon.CambriconConfig{
			ResourceCountName:  "cambricon.com/vmlu",
			ResourceMemoryName: "cambricon.com/mlu.smlu.vmemory",
			ResourceCoreName:   "cambricon.com/mlu.smlu.vcore",
		},
		HygonConfig: hygon.HygonConfig{
			ResourceCountName:  "hygon.com/dcunum",
			ResourceMemoryName: "hygon.com/dcumem",
			ResourceCoreName:   "hygon.com/dcucores",
			MemoryFactor:       1,
		},
		MthreadsConfig: mthreads.MthreadsConfig{
			ResourceCountName:  "mthreads.com/vgpu",
			ResourceMemoryName: "mthreads.com/sgpu-memory",
			ResourceCoreName:   "mthreads.com/sgpu-core",
		},
		KunlunConfig: kunlun.KunlunConfig{
			ResourceCountName:   "kunlunxin.com/xpu",
			ResourceVCountName:  "kunlunxin.com/vxpu",
			ResourceVMemoryName: "kunlunxin.com/vxpu-memory",
		},
		MetaxConfig: metax.MetaxConfig{
			ResourceCountName:   "metax-tech.com/gpu",
			ResourceVCountName:  "metax-tech.com/sgpu",
			ResourceVMemoryName: "metax-tech.com/vmemory",
			ResourceVCoreName:   "metax-tech.com/vcore",
		},
		IluvatarConfig: iluvatarConfig(),
		VNPUs:          ascendConfig(),
	}
}

// ascendConfig is the vnpus section of Go HAMi's Helm chart, as tools/gohami-vectors/vendors
// records it.
func ascendConfig() ascend.VNPUs {
	type tmpl = ascend.Template
	chip := func(word, chipName string, memory, capacity int64, aiCore, aiCPU int32, superPod bool, templates ...tmpl) ascend.VNPUConfig {
		return ascend.VNPUConfig{
			CommonWord: word, ChipName: chipName,
			ResourceName:       "huawei.com/" + word,
			ResourceMemoryName: "huawei.com/" + word + "-memory",
			ResourceCoreName:   "huawei.com/" + word + "-core",
			MemoryAllocatable:  memory, MemoryCapacity: capacity, MemoryFactor: 1,
			AICore: aiCore, AICPU: aiCPU, SuperPod: superPod, Templates: templates,
		}
	}
	return ascend.VNPUs{Configs: []ascend.VNPUConfig{
		chip("Ascend910B3", "910B3", 65536, 65536, 20, 7, false,
			tmpl{Name: "vir05_1c_16g", Memory: 16384, AICore: 5, AICPU: 1},
			tmpl{Name: "vir10_3c_32g", Memory: 32768, AICore: 10, AICPU: 3}),
		chip("Ascend910C", "Ascend910", 65536, 65536, 20, 7, true,
			tmpl{Name: "vir05_1c_16g", Memory: 16384, AICore: 5, AICPU: 1},
			tmpl{Name: "vir10_3c_32g", Memory: 32768, AICore: 10, AICPU: 3}),
	}}
}

// iluvatarConfig is the iluvatars section of Go HAMi's Helm chart.
func iluvatarConfig() []iluvatar.IluvatarConfig {
	out := []iluvatar.IluvatarConfig{}
	for _, word := range []string{"MR-V100", "MR-V50", "BI-V150", "BI-V100"} {
		out = append(out, iluvatar.IluvatarConfig{
			CommonWord: word, ChipName: word,
			ResourceCountName:  "iluvatar.ai/" + word + "-vgpu",
			ResourceMemoryName: "iluvatar.ai/" + word + ".vMem",
			ResourceCoreName:   "iluvatar.ai/" + word + ".vCore",
		})
	}
	return out
}
