package cdclake.stack.registry;

import java.util.ArrayList;
import java.util.List;

import org.jboss.jandex.AnnotationInstance;
import org.jboss.jandex.AnnotationValue;
import org.jboss.jandex.DotName;
import org.jboss.jandex.Type;

import apicurio.common.app.components.config.index.DynamicPropertiesInfoRecorder;
import io.apicurio.common.apps.config.DynamicConfigPropertyDef;
import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import io.quarkus.arc.deployment.BeanDiscoveryFinishedBuildItem;
import io.quarkus.arc.deployment.SyntheticBeanBuildItem;
import io.quarkus.arc.processor.InjectionPointInfo;
import io.quarkus.deployment.annotations.BuildProducer;
import io.quarkus.deployment.annotations.BuildStep;
import io.quarkus.deployment.annotations.ExecutionTime;
import io.quarkus.deployment.annotations.Record;

/** Collects every field annotated @ConfigProperty + @Dynamic and publishes them as a DynamicConfigPropertyList bean. */
public class ConfigIndexProcessor {
    static final DotName CONFIG_PROPERTY = DotName.createSimple("org.eclipse.microprofile.config.inject.ConfigProperty");
    static final DotName DYNAMIC = DotName.createSimple("io.apicurio.common.apps.config.Dynamic");

    @BuildStep
    @Record(ExecutionTime.RUNTIME_INIT)
    void dynamicProperties(DynamicPropertiesInfoRecorder recorder, BeanDiscoveryFinishedBuildItem beans,
                           BuildProducer<SyntheticBeanBuildItem> synthetic) throws Exception {
        List<DynamicConfigPropertyDef> defs = new ArrayList<>();
        for (InjectionPointInfo ip : beans.getInjectionPoints()) {
            AnnotationInstance cp = ip.getRequiredQualifier(CONFIG_PROPERTY);
            if (cp == null || !ip.isField()) continue;
            AnnotationInstance dyn = ip.getTarget().asField().annotation(DYNAMIC);
            if (dyn == null) continue;
            String name = cp.value("name").asString();
            Type actual = ip.getRequiredType().asParameterizedType().arguments().get(0);
            AnnotationValue dv = cp.value("defaultValue");
            if (dv == null) throw new IllegalStateException("Dynamic config property '" + name + "' needs a default value");
            DynamicConfigPropertyDef def = new DynamicConfigPropertyDef(name,
                    Class.forName(actual.name().toString(), false, Thread.currentThread().getContextClassLoader()), dv.asString());
            if (dyn.value("label") != null) def.setLabel(dyn.value("label").asString());
            if (dyn.value("description") != null) def.setDescription(dyn.value("description").asString());
            if (dyn.value("requires") != null) def.setRequires(dyn.value("requires").asStringArray());
            defs.add(def);
        }
        synthetic.produce(SyntheticBeanBuildItem.configure(DynamicConfigPropertyList.class)
                .runtimeValue(recorder.initializePropertiesInfo(defs))
                .unremovable().setRuntimeInit().done());
    }
}
